/* src/base/options.h: defaults parsed like given values, given/required/operands, the rule for
 * shared options and letters, the help's layout. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/base/options.h"

enum { O_MODEL = 1, O_STAGES, O_RATE, O_MODE, O_FLAG, O_HELP };

static const opt_spec good_opts[] = {
    {.id = O_MODEL, .name = "model", .shared = 1},
    {.section = "more"},
    {.id = O_STAGES, .name = "stages", .shared = 1},
    {.id = O_RATE, .name = "rate", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 2,
     .def = "0.5", .help = "a rate"},
    {.id = O_MODE, .name = "mode", .kind = OPT_CHOICE, .choices = "fast|slow|off",
     .def = "slow", .help = "a long help text that has to be wrapped because it goes on and "
                            "on well past the eightieth column of the terminal"},
    {.id = O_FLAG, .name = "flag", .letter = 'f', .kind = OPT_FLAG, .help = "a flag"},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command good = {.name = "test", .usage = "pipetrain test --model FILE",
                                 .opts = good_opts, .operands = 1};

typedef struct {
    const char *model;
    long stages;
    double rate;
    int mode, flag, defaults;
} seen;

/* Parses a NULL-terminated argv (argv[0] is the command); returns opt_next's last value. */
static int parse(const opt_command *cmd, seen *s, opt_parser *p, char **argv)
{
    int argc = 0;
    while (argv[argc]) argc++;
    memset(s, 0, sizeof *s);
    if (opt_parser_init(p, cmd, argc, argv)) return OPT_ERROR;
    int id;
    while ((id = opt_next(p)) > 0) {
        s->defaults += p->is_default;
        switch (id) {
        case O_MODEL: s->model = p->arg; break;
        case O_STAGES: s->stages = p->num; break;
        case O_RATE: s->rate = p->real; break;
        case O_MODE: s->mode = p->choice; break;
        case O_FLAG: s->flag = 1; break;
        }
    }
    return id;
}

Test(options, defaults_then_argv)
{
    char *argv[] = {"test", "-m", "a.cfg", "--mode", "off", "-f", "x.st", NULL};
    seen s;
    opt_parser p;
    cr_assert_eq(parse(&good, &s, &p, argv), OPT_END, "%s", pt_error_get());
    cr_assert_str_eq(s.model, "a.cfg");
    cr_assert_eq(s.stages, 1); /* the shared default */
    cr_assert_float_eq(s.rate, 0.5, 1e-12);
    cr_assert_eq(s.mode, 2);
    cr_assert_eq(s.flag, 1);
    cr_assert_eq(s.defaults, 3); /* stages, rate, mode */
    cr_assert(opt_given(&p, O_MODE) && !opt_given(&p, O_RATE) && opt_given(&p, O_MODEL));
    cr_assert_eq(p.n_operands, 1);
    cr_assert_str_eq(p.operands[0], "x.st");
}

Test(options, errors_name_the_option_and_the_help)
{
    struct {
        char *argv[8];
        const char *message;
    } cases[] = {
        {{"test", "x.st", NULL}, "--model FILE is required (see pipetrain test --help)"},
        {{"test", "-m", "a", NULL}, "1 file is needed, 0 given"},
        {{"test", "-m", "a", "x", "y", NULL}, "unexpected argument y"},
        {{"test", "-m", "a", "x", "--stages", "0", NULL}, "--stages 0: must be between 1"},
        {{"test", "-m", "a", "x", "--rate", "3", NULL}, "--rate 3: must be between 0 and 2"},
        {{"test", "-m", "a", "x", "--rate", "1e", NULL}, "--rate 1e: not a number"},
        {{"test", "-m", "a", "x", "--mode", "on", NULL}, "expected fast, slow or off"},
        {{"test", "-m", "a", "x", "--flag=1", NULL}, "option --flag takes no value"},
        {{"test", "-m", "a", "x", "-q", NULL}, "unknown option -q"},
        {{"test", "-m", "a", "x", "--what", NULL}, "unknown option --what"},
        {{"test", "-m", "a", "x", "--stagesx=2", NULL}, "unknown option --stagesx"},
        {{"test", "x", "--m", "a", NULL}, "option --m is ambiguous: --model, --mode"},
        {{"test", "x", "--model", NULL}, "option --model needs a value (FILE)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        seen s;
        opt_parser p;
        cr_assert_eq(parse(&good, &s, &p, cases[i].argv), OPT_ERROR, "case %zu passed", i);
        cr_assert(strstr(pt_error_get(), cases[i].message), "case %zu: '%s' lacks '%s'", i,
                  pt_error_get(), cases[i].message);
        cr_assert(strstr(pt_error_get(), "(see pipetrain test --help)"), "%s", pt_error_get());
    }
}

Test(options, abbreviations_and_stops)
{
    char *argv[] = {"test", "--model", "a", "--st", "3", "--ra", "1.5", "--", "--flag", NULL};
    seen s;
    opt_parser p;
    cr_assert_eq(parse(&good, &s, &p, argv), OPT_END, "%s", pt_error_get());
    cr_assert_str_eq(s.model, "a");
    cr_assert_eq(s.stages, 3);
    cr_assert_float_eq(s.rate, 1.5, 1e-12);
    cr_assert_eq(s.flag, 0);
    cr_assert_str_eq(p.operands[0], "--flag");
}

/* Tables that break the rule of src/base/options.h are refused. */
Test(options, the_rule_is_enforced)
{
    static const opt_spec shared_with_letter[] = {
        {.id = 1, .name = "model", .shared = 1, .letter = 'x'}, {0}};
    static const opt_spec shared_unmarked[] = {
        {.id = 1, .name = "batch", .kind = OPT_INT, .help = "mine"}, {0}};
    static const opt_spec takes_shared_letter[] = {
        {.id = 1, .name = "mine", .letter = 'k', .kind = OPT_FLAG}, {0}};
    static const opt_spec twice[] = {
        {.id = 1, .name = "a", .kind = OPT_FLAG}, {.id = 2, .name = "a", .kind = OPT_FLAG}, {0}};
    static const opt_spec no_id[] = {{.name = "a", .kind = OPT_FLAG}, {0}};
    const opt_spec *bad[] = {shared_with_letter, shared_unmarked, takes_shared_letter, twice,
                             no_id};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        opt_command cmd = {.name = "bad", .usage = "", .opts = bad[i]};
        opt_parser p;
        char *argv[] = {"bad", NULL};
        cr_assert_eq(opt_parser_init(&p, &cmd, 1, argv), -1, "table %zu accepted", i);
        cr_assert(strstr(pt_error_get(), "option table of pipetrain bad"), "%s", pt_error_get());
    }
}

Test(options, help_layout)
{
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    opt_print_help(&good, f);
    fclose(f);
    cr_assert(strstr(text, "usage: pipetrain test --model FILE\n"), "%s", text);
    cr_assert(strstr(text, "  -m, --model FILE"), "%s", text);
    cr_assert(strstr(text, "(required)"), "%s", text);
    cr_assert(strstr(text, "\nmore\n  -k, --stages K"), "%s", text);
    cr_assert(strstr(text, "      --mode fast|slow|off"), "%s", text);
    cr_assert(strstr(text, "(default slow)"), "%s", text);
    cr_assert(strstr(text, "(default 0.5)"), "%s", text);
    for (char *line = text; *line;) {
        size_t len = strcspn(line, "\n");
        cr_assert(len <= 80, "a line of %zu columns: %.*s", len, (int)len, line);
        line += len + (line[len] == '\n');
    }
    free(text);
}

Test(options, version)
{
    cr_assert(!strncmp(opt_version(), "pipetrain ", 10), "%s", opt_version());
}
