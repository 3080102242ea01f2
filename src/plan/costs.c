/* plan --costs-file FILE (costs.h): profiles kept in a file, read where it has them. */
#include "src/plan/costs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/base/io.h"
#include "src/plan/predict.h"

#define COSTS_MAGIC "pipetrain-costs"
#define COSTS_VERSION 1

/* What makes two profiles comparable: the model, the micro-batch, the cut, the split, the
 * products' precision. */
typedef struct {
    int microbatch, tensor, split;
    tensor_mode mode;
    engine_precision precision;
} costs_key;

static unsigned long long fnv(unsigned long long h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static unsigned long long fnv_int(unsigned long long h, long long v) { return fnv(h, &v, sizeof v); }

unsigned long long plan_costs_model_digest(const net_desc *net)
{
    unsigned long long h = 14695981039346656037ull;
    h = fnv_int(h, net->n_layers);
    h = fnv_int(h, net->input.c), h = fnv_int(h, net->input.h), h = fnv_int(h, net->input.w);
    for (int l = 0; l < net->n_layers; l++) {
        const layer_desc *L = &net->layers[l];
        /* field by field (no padding bytes; the file's line numbers are not the model) */
        long long f[] = {L->type, L->in.c, L->in.h, L->in.w, L->out.c, L->out.h, L->out.w,
                         L->activation, (long long)L->weight_count, (long long)L->bias_count};
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) h = fnv_int(h, f[i]);
        switch (L->type) {
        case LAYER_CONV:
            h = fnv_int(h, L->u.conv.filters), h = fnv_int(h, L->u.conv.size);
            h = fnv_int(h, L->u.conv.stride), h = fnv_int(h, L->u.conv.pad);
            break;
        case LAYER_MAXPOOL:
        case LAYER_AVGPOOL:
            h = fnv_int(h, L->u.pool.size), h = fnv_int(h, L->u.pool.stride);
            break;
        case LAYER_BLOCK:
            h = fnv_int(h, L->u.block.heads), h = fnv_int(h, L->u.block.hidden);
            h = fnv_int(h, L->u.block.seq);
            break;
        case LAYER_LM_HEAD: h = fnv_int(h, L->u.lm_head.tied); break;
        default: break;
        }
    }
    return h;
}

static int key_equal(const costs_key *a, const costs_key *b)
{
    return a->microbatch == b->microbatch && a->tensor == b->tensor && a->split == b->split &&
           (a->tensor == 1 || a->mode == b->mode) && a->precision == b->precision;
}

static int mode_of(const char *name, tensor_mode *m)
{
    for (int i = TENSOR_MEGATRON; i <= TENSOR_SEQUENCE; i++)
        if (!strcmp(name, tensor_mode_name((tensor_mode)i))) return *m = (tensor_mode)i, 0;
    return -1;
}

/* A profile line's end after its split: nothing (fp32's, as files before the precision
 * have it) or "precision fp32|bf16", spaces and the newline aside. −1 for anything else. */
static int precision_of(const char *rest, engine_precision *p)
{
    char word[16], name[16], more[2];
    int n = sscanf(rest, "%15s %15s %1s", word, name, more);
    *p = ENGINE_FP32;
    if (n <= 0) return 0;
    if (n != 2 || strcmp(word, "precision")) return -1;
    if (!strcmp(name, "bf16")) *p = ENGINE_BF16;
    return strcmp(name, "bf16") && strcmp(name, "fp32") ? -1 : 0;
}

/* The next line of f into line (size bytes): 1, 0 at the end, −1 with a message naming
 * the line when it is longer than the buffer (else its rest would be read as the next). */
static int costs_line(char *line, size_t size, FILE *f, const char *path, int lineno)
{
    if (!fgets(line, (int)size, f)) return 0;
    size_t n = strlen(line);
    if (n + 1 < size || line[n - 1] == '\n') return 1;
    int c = getc(f);
    if (c == EOF) return 1;
    ungetc(c, f);
    return pt_error_set("--costs-file %s:%d: longer than %zu characters", path, lineno,
                        size - 2);
}

/* Reads the file's profile for `want` into prof (1), or finds none (0); −1 with a message
 * when the file is of another model or malformed. A missing file holds nothing. */
static int costs_read(const char *path, unsigned long long digest, int n_layers,
                      const costs_key *want, partition_profile *prof)
{
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) return 0;
    /* a FIFO, a device or a directory is refused with what it is (a FIFO blocked the open) */
    FILE *f = pt_fopen_regular(path, "r");
    if (!f) {
        char why[512];
        snprintf(why, sizeof why, "%s", pt_error_get());
        return pt_error_set("--costs-file %s", why);
    }
    char line[512], magic[32], host[128];
    unsigned long long got;
    int version, layers, found = 0, lineno = 1;
    int rd = costs_line(line, sizeof line, f, path, 1);
    if (rd < 0) {
        fclose(f);
        return -1;
    }
    if (!rd ||
        sscanf(line, "%31s %d model %llx layers %d host %127s", magic, &version, &got, &layers,
               host) != 5 ||
        strcmp(magic, COSTS_MAGIC) || version != COSTS_VERSION) {
        fclose(f);
        return pt_error_set("--costs-file %s:1: not a pipetrain costs file (version %d): its first "
                            "line must read '%s %d model DIGEST layers N host NAME'",
                            path, COSTS_VERSION, COSTS_MAGIC, COSTS_VERSION);
    }
    if (got != digest || layers != n_layers) {
        fclose(f);
        return pt_error_set("--costs-file %s: the costs of another model (digest %016llx, %d layers; "
                            "this model: %016llx, %d layers): give another file",
                            path, got, layers, digest, n_layers);
    }
    while ((rd = costs_line(line, sizeof line, f, path, lineno + 1)) > 0) {
        lineno++;
        costs_key k;
        char mode[32];
        /* read wide and checked: %d wrapped 4294967328 to 32, another profile's key */
        long long mb, t, sp;
        int end = 0;
        if (sscanf(line, "profile microbatch %lld tensor %lld mode %31s split %lld%n", &mb, &t,
                   mode, &sp, &end) != 4 || mode_of(mode, &k.mode) || mb < 1 || mb > INT_MAX ||
            t < 1 || t > INT_MAX || sp < 0 || sp > 1 || precision_of(line + end, &k.precision)) {
            fclose(f);
            return pt_error_set("--costs-file %s:%d: expected 'profile microbatch M tensor T mode "
                                "NAME split 0|1 [precision fp32|bf16]'", path, lineno);
        }
        k.microbatch = (int)mb, k.tensor = (int)t, k.split = (int)sp;
        int take = !found && key_equal(&k, want);
        for (int l = 0; l < n_layers; l++) {
            double v[4];
            lineno++;
            if ((rd = costs_line(line, sizeof line, f, path, lineno)) < 0) {
                fclose(f);
                return -1;
            }
            if (!rd || sscanf(line, "%lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3]) != 4 ||
                !(v[0] >= 0) || !(v[1] >= 0) || !(v[2] >= (k.split ? 0 : -1)) ||
                !(v[3] >= (k.split ? 0 : -1))) {
                fclose(f);
                return pt_error_set("--costs-file %s:%d: expected layer %d's four costs (seconds per "
                                    "sample, ≥ 0; −1: not measured, without the split)", path, lineno, l);
            }
            if (!take) continue;
            prof->fwd_s[l] = v[0], prof->bwd_s[l] = v[1];
            if (prof->bwd_input_s) prof->bwd_input_s[l] = v[2], prof->bwd_weight_s[l] = v[3];
        }
        found |= take;
    }
    fclose(f);
    return rd < 0 ? -1 : found;
}

/* Appends prof as `k`'s block, writing the whole file again (a temporary renamed). */
static int costs_add(const char *path, unsigned long long digest, const net_desc *net,
                     const costs_key *k, const partition_profile *prof)
{
    size_t len = strlen(path);
    char *tmp = malloc(len + 16);
    if (!tmp) return pt_error_set("out of memory");
    snprintf(tmp, len + 16, "%s.tmp%ld", path, (long)getpid());
    /* a new file of our own (never through a link someone left at that name) */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    FILE *in = fopen(path, "r"), *out = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (fd >= 0 && !out) close(fd);
    if (!out) {
        if (in) fclose(in);
        pt_error_set("--costs-file %s: cannot write %s: %s", path, tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    char host[128] = "unknown", buf[4096];
    if (gethostname(host, sizeof host) || !*host) strcpy(host, "unknown");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == ' ') *c = '_';
    if (in) { /* the file was read and checked just before: copy it as it is */
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
        fclose(in);
    } else {
        fprintf(out, "%s %d model %016llx layers %d host %s\n", COSTS_MAGIC, COSTS_VERSION, digest,
                net->n_layers, host);
    }
    fprintf(out, "profile microbatch %d tensor %d mode %s split %d%s\n", k->microbatch,
            k->tensor, tensor_mode_name(k->tensor > 1 ? k->mode : TENSOR_MEGATRON), k->split,
            k->precision == ENGINE_BF16 ? " precision bf16" : "");
    for (int l = 0; l < net->n_layers; l++)
        fprintf(out, "%.9e %.9e %.9e %.9e\n", prof->fwd_s[l], prof->bwd_s[l],
                prof->bwd_input_s ? prof->bwd_input_s[l] : -1.0,
                prof->bwd_weight_s ? prof->bwd_weight_s[l] : -1.0);
    int bad = ferror(out);
    if (fclose(out) || bad || rename(tmp, path)) {
        pt_error_set("--costs-file %s: cannot write it: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

int plan_costs_check(const char *path, const net_desc *net)
{
    if (!*path) return pt_error_set("--costs-file: an empty file name");
    /* a key no profile has (micro-batch 0): the whole file is read and checked */
    costs_key none = {.microbatch = 0, .tensor = 1};
    partition_profile unused = {0};
    if (costs_read(path, plan_costs_model_digest(net), net->n_layers, &none, &unused) < 0)
        return -1;
    char *dir = strdup(path);
    if (!dir) return pt_error_set("out of memory");
    char *slash = strrchr(dir, '/');
    const char *d = slash ? (slash == dir ? "/" : (*slash = '\0', dir)) : ".";
    int ok = access(d, W_OK | X_OK) == 0;
    if (!ok) pt_error_set("--costs-file %s: its directory %s is not writable (%s)", path, d,
                          strerror(errno));
    free(dir);
    return ok ? 0 : -1;
}

static int measure(partition_profile *prof, const net_desc *net, const shard_plan *sp,
                   const profile_options *po)
{
    if (sp && sp->T > 1) return plan_profile_shards(prof, net, sp, po);
    return partition_profile_measure_with(prof, net, po);
}

int plan_costs_profile(partition_profile *prof, const net_desc *net, const shard_plan *sp,
                       const profile_options *po, const char *path)
{
    if (!path) return measure(prof, net, sp, po);
    int split = po->split && po->device == ENGINE_CPU;
    costs_key k = {.microbatch = net->sequence ? 1 : po->batch, .tensor = sp ? sp->T : 1,
                   .split = split, .mode = sp ? sp->mode : TENSOR_MEGATRON,
                   .precision = po->precision};
    unsigned long long digest = plan_costs_model_digest(net);
    memset(prof, 0, sizeof *prof);
    int n = net->n_layers;
    prof->n_layers = n;
    prof->fwd_s = calloc((size_t)n, sizeof(double));
    prof->bwd_s = calloc((size_t)n, sizeof(double));
    if (split) {
        prof->bwd_input_s = calloc((size_t)n, sizeof(double));
        prof->bwd_weight_s = calloc((size_t)n, sizeof(double));
    }
    if (!prof->fwd_s || !prof->bwd_s || (split && (!prof->bwd_input_s || !prof->bwd_weight_s))) {
        partition_profile_free(prof);
        return pt_error_set("out of memory");
    }
    int found = costs_read(path, digest, n, &k, prof);
    if (found) {
        if (found < 0) partition_profile_free(prof);
        return found < 0 ? -1 : 0;
    }
    partition_profile_free(prof);
    if (measure(prof, net, sp, po) < 0) return -1;
    if (costs_add(path, digest, net, &k, prof) < 0) {
        partition_profile_free(prof);
        return -1;
    }
    return 0;
}
