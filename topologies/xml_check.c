#include "topologies/xml_check.h"

#include <errno.h>
#include <hwloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "src/base/error.h"

/* The value of attribute `name` inside the tag [tag, end): 0 and its digits in *value when
 * it is there and numeric. */
static int tag_number(const char *tag, const char *end, const char *name, unsigned long long *value)
{
    size_t n = strlen(name);
    for (const char *p = tag; p + n + 2 < end; p++) {
        if (strncmp(p, name, n) || p[n] != '=' || p[n + 1] != '"' || (p > tag && p[-1] != ' ' &&
                                                                       p[-1] != '\t' && p[-1] != '\n'))
            continue;
        char *stop;
        errno = 0;
        *value = strtoull(p + n + 2, &stop, 10);
        return stop > p + n + 2 && errno == 0 ? 0 : -1;
    }
    return -1;
}

static int tag_is_type(const char *tag, const char *end, const char *type)
{
    char want[32];
    int n = snprintf(want, sizeof want, "type=\"%s\"", type);
    for (const char *p = tag; p + n <= end; p++)
        if (!strncmp(p, want, (size_t)n)) return 1;
    return 0;
}

static int line_of(const char *text, const char *at)
{
    int line = 1;
    for (const char *p = text; p < at; p++) line += *p == '\n';
    return line;
}

/* PU and NUMA node numbers within TOPO_MAX_OS_INDEX (a read of the text: hwloc has not
 * seen the file yet). */
static int check_indexes(const char *path, const char *text)
{
    for (const char *tag = strstr(text, "<object"); tag; tag = strstr(tag + 1, "<object")) {
        const char *end = strchr(tag, '>');
        if (!end) break; /* hwloc's parser rejects the truncated tag */
        unsigned long long index;
        int pu = tag_is_type(tag, end, "PU"), numa = tag_is_type(tag, end, "NUMANode");
        if ((pu || numa) && !tag_number(tag, end, "os_index", &index) && index > TOPO_MAX_OS_INDEX)
            return pt_error_set("%s:%d: a %s numbered %llu (os_index): pipetrain takes "
                                "numbers up to %u", path, line_of(text, tag),
                                pu ? "PU" : "NUMA node", index, TOPO_MAX_OS_INDEX);
    }
    return 0;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        pt_error_set("%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap + 1);
    while (text) {
        n += fread(text + n, 1, cap - n, f);
        if (n < cap) break;
        char *grown = realloc(text, 2 * cap + 1);
        if (!grown) {
            free(text);
            text = NULL;
            break;
        }
        text = grown;
        cap *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (!text) {
        pt_error_set("%s: out of memory reading it", path);
        return NULL;
    }
    if (failed) {
        free(text);
        pt_error_set("%s: read error", path);
        return NULL;
    }
    text[n] = '\0';
    return text;
}

enum { HWLOC_REFUSED = 3 }; /* the child's status when hwloc said no without crashing */

/* The child: loads the file as topo_init will, and says by its exit status how it went. */
static void load_in_child(const char *path)
{
    /* The default action for a crash: the parent names the signal, and the handlers that
     * libraries installed (UCX prints a backtrace) stay quiet. */
    static const int crashes[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof crashes / sizeof *crashes; i++) signal(crashes[i], SIG_DFL);
    hwloc_topology_t t;
    int ok = hwloc_topology_init(&t) == 0;
    if (ok) {
        hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
        hwloc_topology_set_icache_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL);
        ok = hwloc_topology_set_xml(t, path) == 0 && hwloc_topology_load(t) == 0;
        hwloc_topology_destroy(t);
    }
    _exit(ok ? 0 : HWLOC_REFUSED); /* no atexit handlers, no MPI: the parent owns those */
}

int topo_xml_check(const char *path)
{
    char *text = read_text(path);
    if (!text) return -1;
    int rc = check_indexes(path, text);
    free(text);
    if (rc) return -1;
    fflush(NULL); /* what the parent buffered must not be written twice */
    pid_t pid = fork();
    if (pid < 0) return pt_error_set("%s: cannot check the topology: fork: %s", path, strerror(errno));
    if (pid == 0) load_in_child(path);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return pt_error_set("%s: cannot check the topology: waitpid: %s", path, strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == HWLOC_REFUSED) return 1;
    char how[64];
    if (WIFSIGNALED(status))
        snprintf(how, sizeof how, "%s", strsignal(WTERMSIG(status)));
    else
        snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(status));
    return pt_error_set("%s: not a valid hwloc XML topology: hwloc crashed reading it (%s); "
                        "HWLOC_XML_VERBOSE=1 lstopo-no-graphics -i FILE may show where", path,
                        how);
}
