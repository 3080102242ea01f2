/* train's checkpoints to resume from (src/train/train_checkpoint.h): writing them every N steps
 * and at the end, and starting a run from the newest usable one. */
#include "src/train/train_checkpoint.h"

#include <limits.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"
#include "src/io/checkpoint.h"
#include "src/io/checkpoint_dir.h"
#include "src/runtime/exec.h"

/* Collective: 0 when every rank's status is 0; else the first failing rank prints its
 * message and every rank returns −1. */
static int all_ok(const train_run *run, int status)
{
    int first_bad = status ? run->rank : INT_MAX;
    if (mpi_wait_allreduce(&first_bad, 1, MPI_INT, MPI_MIN, run->comm, run->o.timeout)) return -1;
    if (first_bad == INT_MAX) return 0;
    if (run->rank == first_bad)
        fprintf(stderr, "pipetrain: rank %d (%s): %s\n", run->rank, run->host, pt_error_get());
    return pt_error_set("rank %d could not %s", first_bad, "take part in the checkpoint");
}

/* FNV-1a 64 of the model file's bytes, as 16 hex digits: a checkpoint names the model it
 * belongs to, whatever the file is called now. */
static int model_hash(const char *path, char out[17])
{
    FILE *f = fopen(path, "rb");
    if (!f) return pt_error_set("%s: cannot read the model file to hash it", path);
    uint64_t h = 0xcbf29ce484222325ull;
    int c;
    while ((c = fgetc(f)) != EOF) {
        h ^= (unsigned char)c;
        h *= 0x100000001b3ull;
    }
    fclose(f);
    snprintf(out, 17, "%016llx", (unsigned long long)h);
    return 0;
}

/* The options a checkpoint's state depends on: a resumed run must have the same, or it
 * would not continue the same training. (The layout may differ.) A field that checkpoints
 * of an earlier version lack stands for `absent` there (NULL: every checkpoint has it). */
typedef struct {
    const char *key;
    char value[64];
    const char *absent;
} meta_field;

enum { N_FIXED = 15 };

static void fixed_fields(const train_run *run, const char *hash, meta_field *f)
{
    const train_options *o = &run->o;
    const optimizer_config *c = &o->opt;
    memset(f, 0, N_FIXED * sizeof *f);
    int i = 0;
    f[i].key = "model_hash";
    snprintf(f[i++].value, sizeof f->value, "%s", hash);
    f[i].key = "seed";
    snprintf(f[i++].value, sizeof f->value, "%llu", o->seed);
    f[i].key = "shuffle";
    snprintf(f[i++].value, sizeof f->value, "%s", o->shuffle ? "on" : "off");
    f[i].key = "batch";
    snprintf(f[i++].value, sizeof f->value, "%d", o->batch);
    f[i].key = "optimizer";
    snprintf(f[i++].value, sizeof f->value, "%s", optimizer_kind_name(c->kind));
    f[i].key = "lr";
    snprintf(f[i++].value, sizeof f->value, "%.9g", (double)c->lr);
    f[i].key = "momentum";
    snprintf(f[i++].value, sizeof f->value, "%.9g", (double)c->momentum);
    f[i].key = "beta1";
    snprintf(f[i++].value, sizeof f->value, "%.9g", (double)c->beta1);
    f[i].key = "beta2";
    snprintf(f[i++].value, sizeof f->value, "%.9g", (double)c->beta2);
    f[i].key = "eps";
    snprintf(f[i++].value, sizeof f->value, "%.9g", (double)c->eps);
    f[i].key = "weight_decay";
    snprintf(f[i++].value, sizeof f->value, "%.9g", (double)c->weight_decay);
    /* the schedule and the clip (the run's length may change on resuming: the schedule
     * then follows the new one) */
    const lr_schedule *s = &o->lr_sched;
    f[i].key = "lr_schedule", f[i].absent = "constant";
    snprintf(f[i++].value, sizeof f->value, "%s", lr_schedule_name(s->kind));
    f[i].key = "lr_warmup", f[i].absent = "0";
    snprintf(f[i++].value, sizeof f->value, "%ld", s->warmup);
    f[i].key = "lr_min", f[i].absent = "0";
    snprintf(f[i++].value, sizeof f->value, "%.17g", s->lr_min);
    f[i].key = "clip_grad_norm", f[i].absent = "0";
    snprintf(f[i++].value, sizeof f->value, "%.9g", (double)c->clip_norm);
}

/* A language model's data position is (seed, step) in its corpus: the corpus (its digest,
 * text_digest of every token before the split; its name only to say which it was) and the
 * split must be the same for a resumed run to draw the same windows. Written only by text
 * runs, so that image checkpoints keep their keys. */
enum { N_TEXT = 4 };

static void text_fields(const train_run *run, meta_field *f)
{
    const train_options *o = &run->o;
    f[0].key = "corpus_digest";
    snprintf(f[0].value, sizeof f->value, "%016llx", (unsigned long long)run->corpus_digest);
    f[1].key = "corpus_tokens";
    snprintf(f[1].value, sizeof f->value, "%zu", run->corpus_tokens);
    f[2].key = "val_fraction";
    snprintf(f[2].value, sizeof f->value, "%.9g", o->val_fraction);
    f[3].key = "corpus";
    snprintf(f[3].value, sizeof f->value, "%.63s",
             o->text == TEXT_FORTUNES ? "fortunes" : o->text_file ? o->text_file : "");
}

/* The checkpoint and the run read the same corpus, split the same way (images: no corpus). */
static int check_corpus(const st_file *f, const char *path, const train_run *run)
{
    const char *digest = st_meta(f, "corpus_digest"), *name = st_meta(f, "corpus");
    if (!run->o.text)
        return digest ? pt_error_set("%s was written by a language model's run on a text "
                                     "corpus (%s), this run reads images", path,
                                     name ? name : "?")
                      : 0;
    if (!digest)
        return pt_error_set("%s was written by a run on images, this run reads a text corpus",
                            path);
    meta_field want[N_TEXT];
    text_fields(run, want);
    const char *tokens = st_meta(f, "corpus_tokens"), *frac = st_meta(f, "val_fraction");
    if (strcmp(digest, want[0].value) || !tokens || strcmp(tokens, want[1].value))
        return pt_error_set("%s was written for another corpus (%s: %s tokens, digest %s); "
                            "this run's %s has %s tokens, digest %s: resume on the same text",
                            path, name ? name : "?", tokens ? tokens : "?", digest,
                            want[3].value, want[1].value, want[0].value);
    if (!frac || strcmp(frac, want[2].value))
        return pt_error_set("%s was written with --val-fraction %s, this run has %s: resume "
                            "with the same --val-fraction (the training part would differ)",
                            path, frac ? frac : "(none)", want[2].value);
    return 0;
}

typedef struct {
    const train_run *run;
    meta_field fixed[N_FIXED];
} resume_check;

/* A count in the metadata: decimal digits only, at most 18 of them. −1 when it is not. */
static long meta_count(const st_file *f, const char *key)
{
    const char *v = st_meta(f, key);
    size_t n = v ? strlen(v) : 0;
    if (n == 0 || n > 18 || strspn(v, "0123456789") != n) return -1;
    return strtol(v, NULL, 10);
}

/* step, epoch and updates: what the run continues from, so each is checked against the
 * others and the run (an edited step would skip steps, an edited update count would reset
 * or break Adam's bias correction). */
static int check_counts(const st_file *f, const char *path, const train_run *run)
{
    const char *raw[3] = {st_meta(f, "step"), st_meta(f, "epoch"), st_meta(f, "updates")};
    for (int i = 0; i < 3; i++)
        if (!raw[i]) raw[i] = "(none)";
    long s = meta_count(f, "step"), e = meta_count(f, "epoch"), u = meta_count(f, "updates");
    if (s < 1)
        return pt_error_set("%s: bad step '%s' in its metadata (a whole number of steps, at "
                            "least 1)", path, raw[0]);
    long per = run->steps_per_epoch;
    if (e < 0 || (per > 0 && e != s / per))
        return pt_error_set("%s: bad epoch '%s' in its metadata (step %ld is in epoch %ld)",
                            path, raw[1], s, per > 0 ? s / per : 0);
    /* one optimizer update per step; plain SGD keeps no count (0) */
    int counted = optimizer_is_adam(run->o.opt.kind);
    if (u < 0 || (counted && u != s) || (!counted && u != 0 && u != s))
        return pt_error_set("%s: bad updates '%s' in its metadata (after step %ld: %ld)", path,
                            raw[2], s, s);
    if (s > run->total_steps)
        return pt_error_set("%s is at step %ld, past this run's last step %ld: give more "
                            "--steps or --epochs", path, s, run->total_steps);
    return 0;
}

/* A metadata value as the user would write it: a number stored exactly ("%.9g" of a float,
 * 0.00100000005) shown as the float it is (0.001); other text as it is. */
static const char *as_written(const char *v, char *buf, size_t size)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end) return v;
    snprintf(buf, size, "%g", (double)(float)x);
    return buf;
}

static int check_compatible(const st_file *f, const char *path, void *arg)
{
    const resume_check *rc = arg;
    for (int i = 0; i < N_FIXED; i++) {
        const char *have = st_meta(f, rc->fixed[i].key);
        if (!have) have = rc->fixed[i].absent;
        if (!have)
            return pt_error_set("%s: its metadata lacks %s", path, rc->fixed[i].key);
        if (strcmp(have, rc->fixed[i].value) != 0) {
            if (!strcmp(rc->fixed[i].key, "model_hash"))
                return pt_error_set("%s was written for another model (its model file's hash "
                                    "%s, %s's is %s)", path, have, rc->run->o.model,
                                    rc->fixed[i].value);
            char was[64], now[64];
            return pt_error_set("%s was written with --%s %s, this run has %s: resume with the "
                                "same --%s", path, rc->fixed[i].key,
                                as_written(have, was, sizeof was),
                                as_written(rc->fixed[i].value, now, sizeof now),
                                rc->fixed[i].key);
        }
    }
    return check_corpus(f, path, rc->run) || check_counts(f, path, rc->run);
}

/* This run's id (rank 0's; only rank 0 writes checkpoints): drawn at a fresh start, taken
 * from the checkpoint a run resumes from, so that --keep prunes the run's own checkpoints
 * across restarts and never another run's. */
static char run_id[17];

static void new_run_id(void)
{
    unsigned long long r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) /* no entropy yet: still distinct */
        r = (unsigned long long)getpid() << 32 ^ (unsigned long long)time(NULL);
    snprintf(run_id, sizeof run_id, "%016llx", r);
}

/* Which moment buffers the optimizer keeps. */
static void moments_used(const train_run *run, int *m, int *v)
{
    *m = run->o.opt.kind != OPTIM_SGD;
    *v = optimizer_is_adam(run->o.opt.kind);
}

int train_checkpoint_setup(train_run *run)
{
    const train_options *o = &run->o;
    run->resumed_from_step = -1;
    int rc = 0;
    /* prepared and locked at start (train_setup.c's check_outputs): again is a no-op */
    if (o->ckpt_dir && run->rank == 0) rc = ckpt_dir_prepare(o->ckpt_dir);
    if (all_ok(run, rc)) return -1;
    if (run->rank == 0) new_run_id();
    if (!o->resume) return 0;

    /* rank 0 chooses (and reports what it refuses); every rank reads the same file */
    resume_check check = {.run = run};
    char hash[17] = "";
    rc = model_hash(o->model, hash);
    if (!rc) fixed_fields(run, hash, check.fixed);
    char path[4096] = "";
    if (!rc && run->rank == 0)
        rc = ckpt_find_latest(o->resume, check_compatible, &check, path, sizeof path);
    if (all_ok(run, rc)) return -1;
    MPI_Request req;
    if (PT_MPI_CALL(MPI_Ibcast(path, sizeof path, MPI_CHAR, 0, run->comm, &req)) ||
        mpi_wait_collective(&req, run->comm, o->timeout))
        return -1;
    snprintf(run->resumed_from, sizeof run->resumed_from, "%s", path);

    size_t P = 0; /* the largest chunk's, whole: one buffer serves each in turn */
    for (int v = 0; v < exec_chunks(run->ex); v++) {
        int c = v * run->o.stages + run->stage;
        size_t n = 0;
        for (int l = run->part.first[c]; l < run->part.first[c + 1]; l++)
            n += run->net.layers[l].weight_count + run->net.layers[l].bias_count;
        if (n > P) P = n;
    }
    int use_m, use_v;
    moments_used(run, &use_m, &use_v);
    /* whole tensors, then (tensor shards) this rank's slices of them */
    float *buf = calloc(6 * (P ? P : 1), sizeof *buf), *mine = buf + 3 * P;
    st_file f = {0};
    rc = buf ? st_read(&f, path) : pt_error_set("out of memory");
    if (!rc) rc = check_compatible(&f, path, &check);
    long step = 0, epoch = 0, updates = 0;
    if (!rc) { /* all three checked by check_compatible */
        step = meta_count(&f, "step");
        epoch = meta_count(&f, "epoch");
        updates = meta_count(&f, "updates");
        const char *id = st_meta(&f, "run_id"); /* a checkpoint from before run ids: a new one */
        if (run->rank == 0 && id && strlen(id) == 16 && strspn(id, "0123456789abcdef") == 16)
            snprintf(run_id, sizeof run_id, "%s", id);
    }
    st_free(&f);
    /* each model chunk this rank holds (one, unless the schedule is interleaved) */
    for (int v = 0; !rc && v < exec_chunks(run->ex); v++) {
        engine *eng = exec_chunk_engine(run->ex, v);
        int c = v * run->o.stages + run->stage;
        int first = run->part.first[c], last = run->part.first[c + 1];
        rc = checkpoint_load_full(path, &run->net, first, last, buf, use_m ? buf + P : NULL,
                                  use_v ? buf + 2 * P : NULL);
        const float *src = buf;
        size_t stride = P;
        if (!rc && run->o.tensor > 1) {
            stride = eng->param_count;
            for (int a = 0; a < 3; a++)
                shard_copy_layers(&run->shard, &run->net, first, last, run->tensor_rank,
                                  mine + (size_t)a * stride, buf + (size_t)a * P, 1);
            src = mine;
        }
        if (!rc)
            rc = engine_write_params(eng, src) ||
                 engine_write_state(eng, src + stride, src + 2 * stride, updates);
    }
    free(buf);
    (void)epoch;
    if (all_ok(run, rc)) return -1;
    run->resumed_from_step = step;
    run->last_checkpoint_step = step; /* it is there already */
    return 0;
}

/* ---- writing: on rank 0, from a gathered copy, in a thread or not ---- */

enum { N_META = 2 * (N_FIXED + N_TEXT + 14) + 1 };

/* One checkpoint being written: everything the write needs, owned, so that training can
 * go on (and change the parameters) meanwhile. */
struct ckpt_writer {
    pthread_t tid;
    int started;              /* a thread runs (or ran) write_checkpoint */
    long step;
    const net_desc *net;      /* the run's, alive until train_checkpoint_finish */
    const char *dir;
    int keep, use_m, use_v;
    size_t P;
    float *all;               /* params | m | v, 3P floats */
    char path[4200];
    meta_field fixed[N_FIXED];
    meta_field text[N_TEXT];  /* a language model's corpus */
    char s_step[32], s_epoch[32], s_upd[32], s_st[16], s_rep[16], s_mb[16];
    const char *meta[N_META];
    int rc;                   /* the outcome, and its message (errors are per thread) */
    char err[1024];
    double seconds;
};

static void *write_checkpoint(void *arg)
{
    struct ckpt_writer *w = arg;
    double t0 = pt_now();
    w->rc = checkpoint_save_full(w->path, w->net, w->all, w->use_m ? w->all + w->P : NULL,
                                 w->use_v ? w->all + 2 * w->P : NULL, w->meta);
    if (!w->rc) w->rc = ckpt_dir_prune(w->dir, w->keep, run_id);
    if (w->rc) snprintf(w->err, sizeof w->err, "%s", pt_error_get());
    w->seconds = pt_now() - t0;
    return NULL;
}

static void writer_free(struct ckpt_writer *w)
{
    if (!w) return;
    free(w->all);
    free(w);
}

/* Collective: the previous write's outcome (rank 0 waits for its thread), agreed. */
static int wait_for_writer(train_run *run)
{
    int rc = 0;
    struct ckpt_writer *w = run->ckpt_writer;
    if (run->rank == 0 && w) {
        if (w->started) pthread_join(w->tid, NULL);
        rc = w->rc ? pt_error_set("%s", w->err) : 0;
        run->ckpt_write_s += w->seconds;
        writer_free(w);
        run->ckpt_writer = NULL;
    }
    return all_ok(run, rc);
}

static void fill_meta(struct ckpt_writer *w, const train_run *run, const char *hash, long step,
                      long updates)
{
    const train_options *o = &run->o;
    fixed_fields(run, hash, w->fixed);
    snprintf(w->s_step, sizeof w->s_step, "%ld", step);
    snprintf(w->s_epoch, sizeof w->s_epoch, "%ld",
             run->steps_per_epoch ? step / run->steps_per_epoch : 0);
    snprintf(w->s_upd, sizeof w->s_upd, "%ld", updates);
    snprintf(w->s_st, sizeof w->s_st, "%d", o->stages);
    snprintf(w->s_rep, sizeof w->s_rep, "%d", o->replicas);
    snprintf(w->s_mb, sizeof w->s_mb, "%d", o->microbatches);
    const char **meta = w->meta;
    int k = 0;
    meta[k++] = "pipetrain_checkpoint", meta[k++] = "1";
    meta[k++] = "step", meta[k++] = w->s_step;
    meta[k++] = "epoch", meta[k++] = w->s_epoch;
    meta[k++] = "updates", meta[k++] = w->s_upd;
    meta[k++] = "model", meta[k++] = o->model;
    for (int i = 0; i < N_FIXED; i++) meta[k++] = w->fixed[i].key, meta[k++] = w->fixed[i].value;
    if (o->text) {
        text_fields(run, w->text);
        for (int i = 0; i < N_TEXT; i++) meta[k++] = w->text[i].key, meta[k++] = w->text[i].value;
    }
    meta[k++] = "stages", meta[k++] = w->s_st;
    meta[k++] = "replicas", meta[k++] = w->s_rep;
    meta[k++] = "microbatches", meta[k++] = w->s_mb;
    meta[k++] = "schedule", meta[k++] = run->sched.name;
    meta[k++] = "version", meta[k++] = PT_VERSION;
    meta[k++] = "commit", meta[k++] = PT_GIT_COMMIT;
    meta[k++] = "run_id", meta[k++] = run_id;
    meta[k++] = "complete", meta[k++] = "1";
    meta[k] = NULL;
}

int train_checkpoint_save(train_run *run, long step)
{
    const train_options *o = &run->o;
    double t0 = pt_now();
    if (wait_for_writer(run)) return -1;
    size_t P = run->net.stored_count;
    int use_m, use_v, root = run->rank == 0;
    moments_used(run, &use_m, &use_v);
    struct ckpt_writer *w = NULL;
    char hash[17] = "";
    int rc = 0;
    if (root) {
        w = calloc(1, sizeof *w);
        if (w) w->all = malloc(3 * (P ? P : 1) * sizeof *w->all);
        if (!w || !w->all) rc = pt_error_set("out of memory for the checkpoint");
        if (!rc) rc = model_hash(o->model, hash);
    }
    if (all_ok(run, rc)) {
        writer_free(w);
        return -1;
    }
    /* replica 0's pipeline holds what every replica holds */
    long updates = 0;
    float *all = w ? w->all : NULL;
    if (run->replica == 0)
        rc = exec_gather_state(run->ex, all, all ? all + P : NULL, all ? all + 2 * P : NULL,
                               use_m, use_v, &updates);
    else if (o->zero && (use_m || use_v)) /* ZeRO: the moments are sharded over the group */
        rc = exec_zero_state_send(run->ex);
    else if (o->zero >= 3) /* ZeRO-3: and the parameters */
        rc = exec_zero_params_send(run->ex);
    if (all_ok(run, rc)) {
        writer_free(w);
        return -1;
    }
    if (root) {
        *w = (struct ckpt_writer){.step = step, .net = &run->net, .dir = o->ckpt_dir,
                                  .keep = o->keep, .use_m = use_m, .use_v = use_v, .P = P,
                                  .all = w->all};
        fill_meta(w, run, hash, step, updates);
        ckpt_dir_file(o->ckpt_dir, step, w->path, sizeof w->path);
        run->ckpt_writer = w;
        if (!o->ckpt_sync && pthread_create(&w->tid, NULL, write_checkpoint, w) == 0)
            w->started = 1;
        else
            write_checkpoint(w); /* --checkpoint-write sync, or no thread to be had */
    }
    run->last_checkpoint_step = step;
    run->ckpt_written++;
    run->ckpt_t_last = pt_now();
    /* a foreground write is agreed now; a background one at the next wait */
    int failed = o->ckpt_sync && wait_for_writer(run);
    run->ckpt_hold_s += pt_now() - t0;
    return failed ? -1 : 0;
}

int train_checkpoint_due(train_run *run, long steps)
{
    const train_options *o = &run->o;
    if (!o->ckpt_dir || steps >= run->total_steps) return 0;
    int due = o->ckpt_every > 0 && steps % o->ckpt_every == 0;
    if (o->ckpt_minutes > 0) {
        if (run->ckpt_req != MPI_REQUEST_NULL) {
            if (mpi_wait_collective(&run->ckpt_req, run->comm, o->timeout)) return -1;
            due |= run->ckpt_flag;
        }
        /* the verdict on the time so far, for the next step; a checkpoint now restarts it */
        run->ckpt_flag = run->rank == 0 && !due &&
                         pt_now() - run->ckpt_t_last >= 60 * o->ckpt_minutes;
        if (PT_MPI_CALL(MPI_Ibcast(&run->ckpt_flag, 1, MPI_INT, 0, run->comm, &run->ckpt_req)))
            return -1;
    }
    return due;
}

int train_checkpoint_finish(train_run *run)
{
    int rc = 0;
    if (run->ckpt_req != MPI_REQUEST_NULL &&
        mpi_wait_collective(&run->ckpt_req, run->comm, run->o.timeout))
        rc = -1;
    if (wait_for_writer(run)) rc = -1;
    return rc;
}
