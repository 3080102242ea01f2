/* Tests of how pipetrain writes the files a user names (src/base/output.c) and of the
 * checkpoint checksums (src/io/safetensors.c): a planted link is replaced, never written
 * through; a FIFO, a device or a directory at the path is refused; an existing file keeps
 * its mode; a flipped bit in a tensor or in the metadata is found and named; metadata that
 * is not UTF-8 (a model path on Linux may be anything) is written, not "out of memory". */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/base/output.h"
#include "src/io/checkpoint_dir.h"
#include "src/io/safetensors.h"
#include "tests/check.h"

static char dir[64], path[160];
static const float data[4] = {1.0f, -2.0f, 0.5f, 3.25f};
static const char *const meta[] = {"pipetrain_checkpoint", "1", "step", "3", NULL};

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/pt_test_out_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(output, .init = make_dir, .fini = remove_dir);

static int write_ck(const char *p)
{
    st_tensor t[2] = {{.name = "layers.0.weight", .ndim = 1, .shape = {3}, .data = data},
                      {.name = "layers.2.bias", .ndim = 1, .shape = {1}, .data = data + 3}};
    return st_write_meta(p, t, 2, meta);
}

static void write_text(const char *p, const char *text)
{
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

static void expect_text(const char *p, const char *text)
{
    char got[256] = "";
    FILE *f = fopen(p, "r");
    cr_assert_not_null(f, "%s is gone", p);
    size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    got[n] = '\0';
    cr_expect_str_eq(got, text, "%s was written through a link", p);
}

Test(output, a_planted_link_is_replaced_not_followed)
{
    char victim[200];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    write_text(victim, "precious\n");
    cr_assert_eq(symlink(victim, path), 0);
    /* and at the temporary names the writer used to take (PATH.tmp-PID-SERIAL) */
    for (int serial = 0; serial < 4; serial++) {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s.tmp-%ld-%d", path, (long)getpid(), serial);
        cr_assert_eq(symlink(victim, tmp), 0);
    }
    cr_assert_eq(write_ck(path), 0, "%s", pt_error_get());
    expect_text(victim, "precious\n");
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0);
    cr_expect(S_ISREG(st.st_mode), "the checkpoint is still a link");
}

Test(output, the_probe_never_follows_a_link)
{
    char victim[200], probe[200];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    write_text(victim, "precious\n");
    /* the name the probe had before, and a few around it */
    for (long pid = (long)getpid() - 2; pid <= (long)getpid() + 2; pid++) {
        snprintf(probe, sizeof probe, "%s/.pipetrain-probe-%ld", dir, pid);
        cr_assert_eq(symlink(victim, probe), 0);
    }
    cr_assert_eq(ckpt_dir_prepare(dir), 0, "%s", pt_error_get());
    expect_text(victim, "precious\n");
}

/* The device is a twin of /dev/full made in the test's directory (as root; skipped
 * otherwise), so that a writer that replaces it harms nothing outside. */
Test(output, what_is_not_a_file_is_refused)
{
    char fifo[200], sub[200], full[200];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    snprintf(full, sizeof full, "%s/full", dir);
    int have_device = mknod(full, S_IFCHR | 0666, makedev(1, 7)) == 0;
    const struct {
        const char *path, *words;
    } cases[] = {{fifo, "FIFO"}, {sub, "directory"}, {"", "empty"}, {"some/dir/", "ends in '/'"},
                 {full, "character device"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases - !have_device; i++) {
        pt_error_clear();
        cr_expect_eq(pt_output_check("--save", cases[i].path), -1, "%s taken", cases[i].path);
        cr_expect(strstr(pt_error_get(), cases[i].words), "%s: \"%s\"", cases[i].path,
                  pt_error_get());
        cr_expect_eq(write_ck(cases[i].path), -1, "%s written", cases[i].path);
    }
    struct stat st;
    cr_expect(!have_device || (stat(full, &st) == 0 && S_ISCHR(st.st_mode)),
              "the device was replaced");
    cr_expect(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was replaced");
    cr_expect_eq(pt_output_check("--save", path), 0, "%s", pt_error_get());
}

Test(output, an_existing_file_keeps_its_mode)
{
    write_text(path, "old\n");
    cr_assert_eq(chmod(path, 0600), 0);
    cr_assert_eq(write_ck(path), 0, "%s", pt_error_get());
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600, "mode %o", st.st_mode & 0777);
}

/* Flips one bit at byte `at` (from the end when negative). */
static void flip(long at)
{
    int fd = open(path, O_RDWR);
    cr_assert(fd >= 0);
    off_t size = lseek(fd, 0, SEEK_END);
    off_t off = at < 0 ? size + at : at;
    unsigned char b;
    cr_assert_eq(pread(fd, &b, 1, off), 1);
    b ^= 0x10;
    cr_assert_eq(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

Test(output, a_flipped_bit_is_found_and_named)
{
    cr_assert_eq(write_ck(path), 0, "%s", pt_error_get());
    st_file f;
    cr_assert_eq(st_read(&f, path), 0, "%s", pt_error_get());
    cr_expect(f.checksummed);
    st_free(&f);
    flip(-2); /* inside the last tensor, layers.2.bias */
    cr_expect_eq(st_read(&f, path), -1, "a corrupt tensor was read");
    cr_expect(strstr(pt_error_get(), "'layers.2.bias' fails its checksum"), "\"%s\"",
              pt_error_get());
    flip(-2);
    cr_assert_eq(write_ck(path), 0);
    /* the step's value, "3" -> "#": the metadata's checksum */
    char text[4096];
    FILE *fp = fopen(path, "rb");
    size_t n = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[n] = '\0';
    char *step = strstr(text + 8, "\"step\":\"3\"");
    cr_assert_not_null(step);
    flip(step + strlen("\"step\":\"") - text); /* its '3' becomes '#' */
    cr_expect_eq(st_read(&f, path), -1, "edited metadata was read");
    cr_expect(strstr(pt_error_get(), "metadata fails its checksum"), "\"%s\"", pt_error_get());
}

Test(output, metadata_that_is_not_utf8_is_written)
{
    const char *bad[] = {"model", "models/\xff\xfe-net.cfg", NULL};
    st_tensor t = {.name = "w", .ndim = 1, .shape = {4}, .data = data};
    cr_assert_eq(st_write_meta(path, &t, 1, bad), 0, "%s", pt_error_get());
    st_file f;
    cr_assert_eq(st_read(&f, path), 0, "%s", pt_error_get());
    cr_expect_str_eq(st_meta(&f, "model"), "models/\\xff\\xfe-net.cfg");
    st_free(&f);
}
