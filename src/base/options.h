/* Command-line options: one table per command drives getopt_long and prints the help, so
 * that what a command accepts and what its help says cannot drift. A default in the table
 * is parsed like a value given on the command line (before argv), so the help's
 * "(default X)" is the value the command starts from.
 *
 * Names and letters, one rule for every command: the options that several commands share
 * (--model, --stages, --replicas, --microbatches, --batch, --schedule, --partition,
 * --device, --topology, --json, --help; the table opt_shared in options.c) have one meaning,
 * range, default, help text and short letter wherever they appear:
 *     -m --model  -k --stages  -r --replicas  -M --microbatches  -b --batch  -s --schedule
 *     -p --partition  -d --device  -t --topology  -j --json  -h --help
 * A command's table names them only (.shared = 1) and may only make them required. A
 * command's own options are long only, except letters no shared option uses that a
 * command had before this rule (plan's -r -n -g -x). opt_parser_init refuses a table that
 * breaks the rule, so the --help tests of every command catch it. */
#ifndef PT_OPTIONS_H
#define PT_OPTIONS_H

#include <getopt.h>
#include <stdio.h>

/* Strict parsing of command-line numbers: the whole string must be a number in range. */
int opt_parse_long(const char *name, const char *text, long min, long max, long *out);
int opt_parse_double(const char *name, const char *text, double min, double max, double *out);

typedef enum {
    OPT_FLAG = 1, /* no value */
    OPT_TEXT,     /* any string: a file, a method name checked later */
    OPT_INT,      /* an integer in [min, max] (both 0: any) */
    OPT_REAL,     /* a finite number in [min, max] (both 0: any) */
    OPT_CHOICE,   /* one of choices ("sgd|momentum|adam"); opt_parser.choice is its index */
} opt_kind;

typedef struct {
    int id;              /* what opt_next returns for this option (> 0) */
    const char *name;    /* long name without "--"; NULL: a section heading */
    char letter;         /* short option, or 0 */
    opt_kind kind;
    const char *arg;     /* placeholder in the help (FILE, N, X); OPT_CHOICE shows choices */
    const char *choices; /* OPT_CHOICE: "a|b|c" */
    double min, max;     /* OPT_INT, OPT_REAL */
    const char *def;     /* default, parsed before argv; NULL: none */
    const char *help;    /* NULL: not in the help (testing options, old names) */
    int shared;          /* 1: everything but id and required comes from opt_shared */
    int required;
    const char *section; /* with name NULL: the heading printed before the next options */
} opt_spec;

typedef struct {
    const char *name;     /* "train": the sub-command, for messages */
    const char *usage;    /* lines after "usage: ", '\n' between them */
    const char *about;    /* after the usage lines, wrapped at 80 columns; '\n' breaks a
                             line (may be NULL) */
    const char *notes;    /* the same after the options (may be NULL) */
    const opt_spec *opts; /* ends with an entry whose name and section are both NULL */
    int operands;         /* positional arguments: exactly this many (0: none allowed) */
} opt_command;

#define OPT_MAX 96

typedef struct {
    const opt_command *cmd;
    int n;
    opt_spec specs[OPT_MAX]; /* the command's options, shared ones filled in */
    unsigned char given[OPT_MAX];
    struct option longopts[OPT_MAX + 1];
    char shortopts[3 * OPT_MAX + 2];
    int argc, next_default, started;
    char **argv;
    char name_buf[72];
    /* the option opt_next returned */
    const char *name; /* "--batch", also when given as -b */
    const char *arg;  /* its value as text (NULL for a flag) */
    long num;         /* OPT_INT */
    double real;      /* OPT_REAL */
    int choice;       /* OPT_CHOICE */
    int is_default;   /* the value is the table's default, not from argv */
    /* after OPT_END */
    char **operands;
    int n_operands;
} opt_parser;

enum { OPT_END = 0, OPT_ERROR = -1 };

/* Resolves cmd's table (−1 with a message when it breaks the rule above). */
int opt_parser_init(opt_parser *p, const opt_command *cmd, int argc, char **argv);
/* The next option: first every default, then argv in order. Returns its id with the
 * value parsed into p, OPT_END when argv is done (then the required options and the
 * number of operands have been checked), or OPT_ERROR with a message that ends with
 * "(see pipetrain CMD --help)". */
int opt_next(opt_parser *p);
/* Whether argv gave the option (a default does not count). */
int opt_given(const opt_parser *p, int id);
/* Records "MESSAGE (see pipetrain CMD --help)" and returns −1. */
int opt_error(const opt_parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The shared ZeRO choices given with a --zero they do not belong to (--zero3-prefetch with
 * 1 or 2, --zero-overlap with 1): −1 with a message naming this `what` ("run", "plan").
 * With --zero 0 both are taken and change nothing (launch re-plans a ZeRO job that lost
 * its replicas with --zero 0 added). prefetch_id, overlap_id: the command's ids of them. */
int opt_check_zero_choices(const opt_parser *p, int zero, int prefetch_id, int overlap_id,
                           const char *what);
void opt_print_help(const opt_command *cmd, FILE *f);

/* Exit statuses of the commands: 0 done, 1 failed, 2 wrong usage. */
enum { PT_EXIT_OK = 0, PT_EXIT_FAIL = 1, PT_EXIT_USAGE = 2 };

/* "pipetrain 0.1.0 (git abc1234)" or without the commit when it is unknown. */
const char *opt_version(void);

#endif
