/* Tests of topologies/xml_check.c: a topology file on which hwloc 2.9 crashes, or whose PU
 * numbers would make hwloc allocate gigabytes, is refused with a message naming the file,
 * and the process that asked goes on (hwloc reads the file in a child first). Without the
 * check, these cases end the test process with SIGSEGV or cost half a gigabyte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/error.h"
#include "tests/check.h"
#include "topologies/topo.h"
#include "topologies/xml_check.h"

static char text[1 << 20];

/* topologies/NAME with the first `from` replaced by `to`, written to a temporary file. */
static void edited(char *path, size_t size, const char *name, const char *from, const char *to)
{
    char src[1024];
    snprintf(src, sizeof src, "%s/topologies/%s", check_source_dir(), name);
    FILE *f = fopen(src, "r");
    cr_assert(f, "cannot read %s", src);
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    char *at = strstr(text, from);
    cr_assert(at, "%s has no \"%s\"", src, from);
    snprintf(path, size, "/tmp/pt-topo-xml-%d.xml", (int)getpid());
    f = fopen(path, "w");
    cr_assert(f);
    fwrite(text, 1, (size_t)(at - text), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
}

static void expect_refused(const char *path, const char *words)
{
    topo_t *t = (topo_t *)1;
    pt_error_clear();
    cr_expect_eq(topo_init(&t, path), -1, "%s loaded", path);
    cr_expect_null(t);
    cr_expect(strstr(pt_error_get(), path) && strstr(pt_error_get(), words),
              "message \"%s\" lacks \"%s\"", pt_error_get(), words);
}

/* One misspelt attribute in a shipped file: hwloc dereferences the cpuset it lacks. */
Test(topo_xml, misspelt_cpuset_is_a_message_not_a_crash)
{
    static const char *const attrs[] = {" complete_cpuset=", " complete_nodeset="};
    char path[256];
    for (size_t i = 0; i < sizeof attrs / sizeof *attrs; i++) {
        char to[64]; /* " complete_cpusetx=" */
        snprintf(to, sizeof to, "%.*sx=", (int)strlen(attrs[i]) - 1, attrs[i]);
        edited(path, sizeof path, "ws-4gpu.xml", attrs[i], to);
        expect_refused(path, "hwloc crashed reading it");
        unlink(path);
    }
}

/* A PU numbered 4294967295: refused before hwloc sizes a bitmap by it (hwloc itself would
 * take the file, after allocating half a gigabyte). */
Test(topo_xml, huge_pu_number_is_refused_cheaply)
{
    char path[256];
    edited(path, sizeof path, "local-2core.xml", "type=\"PU\" os_index=\"1\"",
           "type=\"PU\" os_index=\"4294967295\"");
    expect_refused(path, "os_index");
    cr_expect(strstr(pt_error_get(), ":"), "no line in \"%s\"", pt_error_get());
    unlink(path);
    edited(path, sizeof path, "local-2core.xml", "type=\"PU\" os_index=\"1\"",
           "type=\"PU\" os_index=\"1048575\"");
    pt_error_clear();
    cr_expect_eq(topo_xml_check(path), 0, "the largest number taken was refused: %s",
                 pt_error_get());
    unlink(path);
}

/* Every shipped description still loads through the check. */
Test(topo_xml, shipped_files_pass)
{
    static const char *const files[] = {"local-2core.xml", "ws-4gpu.xml", "node-16c-1gpu.xml",
                                        "node-2s-8gpu.xml"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/topologies/%s", check_source_dir(), files[i]);
        pt_error_clear();
        cr_expect_eq(topo_xml_check(path), 0, "%s: %s", files[i], pt_error_get());
    }
}
