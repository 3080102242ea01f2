/* A mock of the CUDA runtime and of kernels/cuda for testing src/cuda/engine_cuda.c on a
 * machine without a GPU. Every stream is a FIFO of deferred operations; operations run
 * only when the mock decides (eager: at once; lazy: only at host synchronisation points;
 * random: a few at random at every API call), picking a random stream among those whose
 * head can run. Waits (cudaStreamWaitEvent) block a stream's head until the event's
 * captured position has run. Kernels call the CPU twins. Device and host memory are
 * tracked so that a kernel given a host pointer, or a copy in the wrong direction, aborts. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create (mock_cuda_vmm.c) */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kernels_cuda.h"
#include "src/base/error.h"

int mock_mode = 0;          /* 0 eager, 1 lazy, 2 random */
unsigned mock_seed = 1;
int mock_fail_next_malloc = 0;
int mock_no_device = 0;
long mock_ops_run = 0;

static unsigned rnd(void)
{
    mock_seed = mock_seed * 1103515245u + 12345u;
    return (mock_seed >> 16) & 0x7fff;
}

static void die(const char *msg)
{
    fprintf(stderr, "MOCK FATAL: %s\n", msg);
    abort();
}

/* ---- memory registry ---- */
typedef struct { char *p; size_t n; int device; } region;
static region regions[4096];
static int n_regions;

static int find_region(const void *p)
{
    for (int i = 0; i < n_regions; i++)
        if ((const char *)p >= regions[i].p && (const char *)p < regions[i].p + regions[i].n)
            return i;
    return -1;
}
static int is_device(const void *p)
{
    int i = find_region(p);
    return i >= 0 && regions[i].device;
}
static void need_dev(const void *p, const char *what)
{
    if (p && !is_device(p)) {
        fprintf(stderr, "MOCK FATAL: %s: %p is not device memory\n", what, p);
        abort();
    }
}
static void add_region(void *p, size_t n, int dev)
{
    if (n_regions == 4096) die("too many regions");
    regions[n_regions++] = (region){p, n, dev};
}
static void del_region(void *p)
{
    for (int i = 0; i < n_regions; i++)
        if (regions[i].p == p) {
            regions[i] = regions[--n_regions];
            return;
        }
    die("free of unknown pointer");
}

/* ---- streams, events, ops ---- */
typedef struct op op;
struct op {
    void (*fn)(op *);
    op *next;
    void *p[8];
    int i[8];
    size_t z[4];
    float f[8];
    uint64_t u[4];
    long l;
    kernel_conv2d_dims d;
    struct CUstream_st *ws;
    unsigned long wseq;
    struct CUevent_st *ev;
};
struct CUstream_st {
    op *head, *tail;
    unsigned long queued, done;
};
struct CUevent_st {
    struct CUstream_st *s;
    unsigned long seq;
    double t;
    int timing, recorded;
};
static struct CUstream_st *streams[64];
static int n_streams;
static double clock_ms;

static int head_runnable(struct CUstream_st *s)
{
    if (!s->head) return 0;
    if (s->head->ws) return s->head->ws->done >= s->head->wseq;
    return 1;
}

static int run_one(void)
{
    int cand[64], n = 0;
    for (int i = 0; i < n_streams; i++)
        if (head_runnable(streams[i])) cand[n++] = i;
    if (!n) return 0;
    struct CUstream_st *s = streams[cand[rnd() % n]];
    op *o = s->head;
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    if (o->fn) o->fn(o);
    clock_ms += 0.001;
    s->done++;
    mock_ops_run++;
    free(o);
    return 1;
}

void mock_progress(void)
{
    if (!run_one()) {
        for (int i = 0; i < n_streams; i++)
            if (streams[i]->head) die("deadlock: work queued but nothing can run");
    }
}

static void background(void)
{
    if (mock_mode == 0)
        while (run_one()) {}
    else if (mock_mode == 2)
        for (unsigned k = rnd() % 4; k > 0; k--) run_one();
}

static op *enqueue(cudaStream_t s, void (*fn)(op *))
{
    if (!s) die("enqueue on the legacy default stream");
    op *o = calloc(1, sizeof *o);
    o->fn = fn;
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    s->queued++;
    return o;
}

static int ev_done(const struct CUevent_st *e) { return !e->s || e->s->done >= e->seq; }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags;
    if (n_streams == 64) die("too many streams");
    *s = calloc(1, sizeof **s);
    streams[n_streams++] = *s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    while (s->done < s->queued)
        if (!run_one()) die("deadlock in cudaStreamSynchronize");
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    cudaStreamSynchronize(s);
    for (int i = 0; i < n_streams; i++)
        if (streams[i] == s) streams[i] = streams[--n_streams];
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    if (!e) die("wait on a NULL event");
    if (e->s) {
        op *o = enqueue(s, NULL);
        o->ws = e->s;
        o->wseq = e->seq;
    }
    background();
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    *e = calloc(1, sizeof **e);
    (*e)->timing = !(flags & cudaEventDisableTiming);
    return cudaSuccess;
}
static void run_record(op *o) { o->ev->t = clock_ms; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    op *o = enqueue(s, run_record);
    o->ev = e;
    e->s = s;
    e->seq = s->queued;
    e->recorded = 1;
    background();
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e)
{
    background();
    return ev_done(e) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    while (!ev_done(e))
        if (!run_one()) die("deadlock in cudaEventSynchronize");
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    if (!a->timing || !b->timing || !a->recorded || !b->recorded || !ev_done(a) ||
        !ev_done(b))
        die("bad cudaEventElapsedTime");
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d)
{
    (void)d;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaErrorMemoryAllocation ? "out of memory" : "mock error"; }
const char *cudaGetErrorName(cudaError_t e) { (void)e; return "cudaErrorMock"; }
cudaError_t cudaMemGetInfo(size_t *f, size_t *t)
{
    *f = 1000;
    *t = 2000;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n)
{
    if (mock_fail_next_malloc) {
        mock_fail_next_malloc = 0;
        *p = NULL;
        return cudaErrorMemoryAllocation;
    }
    *p = aligned_alloc(256, (n + 255) / 256 * 256);
    memset(*p, 0xA5, n); /* garbage: the engine must not rely on fresh memory being zero */
    add_region(*p, n, 1);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    del_region(p);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    *p = aligned_alloc(256, (n + 255) / 256 * 256);
    memset(*p, 0x5A, n);
    add_region(*p, n, 0);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p)
{
    del_region(p);
    free(p);
    return cudaSuccess;
}
/* The engine names every copy's direction: it must match where the pointers live. */
static void check_direction(const void *dst, const void *src, enum cudaMemcpyKind kind,
                            const char *what)
{
    int dd = is_device(dst), sd = is_device(src);
    if ((kind == cudaMemcpyHostToDevice && (!dd || sd)) ||
        (kind == cudaMemcpyDeviceToHost && (dd || !sd)) ||
        (kind == cudaMemcpyDeviceToDevice && (!dd || !sd)) || kind == cudaMemcpyDefault ||
        kind == cudaMemcpyHostToHost) {
        fprintf(stderr, "MOCK FATAL: %s direction does not match the pointers\n", what);
        abort();
    }
}
static void run_memcpy(op *o) { memcpy(o->p[0], o->p[1], o->z[0]); }
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    check_direction(dst, src, kind, "cudaMemcpyAsync");
    /* the whole range must lie inside one region */
    int di = find_region(dst), si = find_region(src);
    if ((di >= 0 && (char *)dst + n > regions[di].p + regions[di].n) ||
        (si >= 0 && (const char *)src + n > regions[si].p + regions[si].n))
        die("cudaMemcpyAsync out of bounds");
    op *o = enqueue(s, run_memcpy);
    o->p[0] = dst;
    o->p[1] = (void *)src;
    o->z[0] = n;
    background();
    return cudaSuccess;
}
static void run_memcpy2d(op *o)
{
    for (size_t r = 0; r < o->z[1]; r++)
        memcpy((char *)o->p[0] + r * o->z[2], (const char *)o->p[1] + r * o->z[3], o->z[0]);
}
/* Rows [p, p + width) every pitch bytes: the first and the last byte touched must lie in
 * p's region (regions are contiguous, so every row then does). Unregistered host memory
 * is not checked, as in cudaMemcpyAsync. */
static void check_rows(const void *p, size_t pitch, size_t width, size_t height)
{
    int i = find_region(p);
    if (i < 0 || width == 0 || height == 0) return;
    if (width > pitch) die("cudaMemcpy2DAsync width larger than the pitch");
    if ((height - 1) > (regions[i].n - 1) / pitch ||
        (const char *)p + (height - 1) * pitch + width > regions[i].p + regions[i].n)
        die("cudaMemcpy2DAsync out of bounds");
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s)
{
    check_direction(dst, src, kind, "cudaMemcpy2DAsync");
    check_rows(dst, dpitch, width, height);
    check_rows(src, spitch, width, height);
    op *o = enqueue(s, run_memcpy2d);
    o->p[0] = dst;
    o->p[1] = (void *)src;
    o->z[0] = width;
    o->z[1] = height;
    o->z[2] = dpitch;
    o->z[3] = spitch;
    background();
    return cudaSuccess;
}
static void run_memset(op *o) { memset(o->p[0], o->i[0], o->z[0]); }
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
    need_dev(p, "cudaMemsetAsync");
    op *o = enqueue(s, run_memset);
    o->p[0] = p;
    o->i[0] = v;
    o->z[0] = n;
    background();
    return cudaSuccess;
}

/* ---- kernels ---- */
int kernel_cuda_ctx_init(kernel_cuda_ctx *c, int device)
{
    memset(c, 0, sizeof *c);
    if (mock_no_device) return pt_error_set("no CUDA device: mock");
    (void)device;
    const char *mode = getenv("PT_MOCK_CUDA_MODE"); /* the mock plugin's runs */
    if (mode) mock_mode = atoi(mode);
    cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    return 0;
}
void kernel_cuda_ctx_free(kernel_cuda_ctx *c)
{
    if (c->stream) cudaStreamDestroy(c->stream);
    c->stream = NULL;
}

#define KOP(fn) op *o = enqueue(ctx->stream, fn)
#define DONE() do { background(); return 0; } while (0)

#include "tests/cuda/mock_cuda_precision.c"

static void r_dense_f(op *o)
{
    const int n = o->i[0], in_f = o->i[1], out_f = o->i[2], prec = o->i[PREC];
    float *ri = rounded(o->p[1], (size_t)n * in_f, prec), *rw = rounded(o->p[2], (size_t)out_f * in_f, prec);
    kernel_dense_forward_cpu(o->p[0], ri, rw, o->p[3], n, in_f, out_f);
    unround(ri, o->p[1]); unround(rw, o->p[2]);
}
int kernel_dense_forward_cuda(float *out, const float *in, const float *w, const float *b, int n,
                              int in_f, int out_f, const kernel_cuda_ctx *ctx)
{
    need_dev(out, "dense out"); need_dev(in, "dense in"); need_dev(w, "dense w"); need_dev(b, "dense b");
    KOP(r_dense_f);
    o->i[PREC] = ctx_precision(ctx);
    o->p[0] = out; o->p[1] = (void *)in; o->p[2] = (void *)w; o->p[3] = (void *)b;
    o->i[0] = n; o->i[1] = in_f; o->i[2] = out_f;
    DONE();
}
static void r_dense_b(op *o)
{
    if (o->i[PREC] == KERNEL_CUDA_FP32) {
        kernel_dense_backward_cpu(o->p[0], o->p[1], o->p[2], o->p[3], o->p[4], o->p[5], o->i[0], o->i[1], o->i[2]);
        return;
    }
    /* the CPU's fused call: the weight half, then the input half */
    dense_weight(o->p[1], o->p[2], o->p[3], o->p[4], o->i[0], o->i[1], o->i[2], o->i[PREC]);
    if (o->p[0]) dense_input(o->p[0], o->p[3], o->p[5], o->i[0], o->i[1], o->i[2], o->i[PREC]);
}
int kernel_dense_backward_cuda(float *din, float *dw, float *db, const float *dout,
                               const float *in, const float *w, int n, int in_f, int out_f,
                               const kernel_cuda_ctx *ctx)
{
    need_dev(din, "dense din"); need_dev(dw, "dw"); need_dev(db, "db"); need_dev(dout, "dout"); need_dev(in, "in"); need_dev(w, "w");
    KOP(r_dense_b);
    o->i[PREC] = ctx_precision(ctx);
    o->p[0] = din; o->p[1] = dw; o->p[2] = db; o->p[3] = (void *)dout; o->p[4] = (void *)in; o->p[5] = (void *)w;
    o->i[0] = n; o->i[1] = in_f; o->i[2] = out_f;
    DONE();
}
static void r_dense_bw(op *o) { dense_weight(o->p[0], o->p[1], o->p[2], o->p[3], o->i[0], o->i[1], o->i[2], o->i[PREC]); }
int kernel_dense_backward_weight_cuda(float *dw, float *db, const float *dout, const float *in,
                                      int n, int in_f, int out_f, const kernel_cuda_ctx *ctx)
{
    need_dev(dw, "dw"); need_dev(db, "db"); need_dev(dout, "dout"); need_dev(in, "in");
    KOP(r_dense_bw);
    o->i[PREC] = ctx_precision(ctx);
    o->p[0] = dw; o->p[1] = db; o->p[2] = (void *)dout; o->p[3] = (void *)in;
    o->i[0] = n; o->i[1] = in_f; o->i[2] = out_f;
    DONE();
}
static void r_dense_bi(op *o) { dense_input(o->p[0], o->p[1], o->p[2], o->i[0], o->i[1], o->i[2], o->i[PREC]); }
int kernel_dense_backward_input_cuda(float *din, const float *dout, const float *w, int n,
                                     int in_f, int out_f, const kernel_cuda_ctx *ctx)
{
    need_dev(din, "dense din"); need_dev(dout, "dout"); need_dev(w, "w");
    if (!din) die("dense input gradient without din");
    KOP(r_dense_bi);
    o->i[PREC] = ctx_precision(ctx);
    o->p[0] = din; o->p[1] = (void *)dout; o->p[2] = (void *)w;
    o->i[0] = n; o->i[1] = in_f; o->i[2] = out_f;
    DONE();
}
static void r_dense_wu(op *o)
{
    const int n = o->i[0], in_f = o->i[1], out_f = o->i[2], u0 = o->i[3], units = o->i[4], prec = o->i[PREC];
    float *rd = rounded(o->p[2], (size_t)n * out_f, prec), *ri = rounded(o->p[3], (size_t)n * in_f, prec);
    kernel_dense_weight_grad_units_cpu(o->p[0], prec == KERNEL_CUDA_FP32 ? o->p[1] : NULL, rd, ri, n, in_f, out_f, u0, units);
    unround(rd, o->p[2]); unround(ri, o->p[3]);
    if (prec == KERNEL_CUDA_FP32 || !o->p[1]) return;
    float *spare = zeros((size_t)out_f * in_f); /* db from the unrounded dout, as dense_weight */
    kernel_dense_weight_grad_units_cpu(spare, o->p[1], o->p[2], o->p[3], n, in_f, out_f, u0, units);
    free(spare);
}
int kernel_dense_weight_grad_units_cuda(float *dw, float *db, const float *dout,
                                        const float *in, int n, int in_f, int out_f, int u0,
                                        int units, const kernel_cuda_ctx *ctx)
{
    need_dev(dw, "dw"); need_dev(db, "db"); need_dev(dout, "dout"); need_dev(in, "in");
    if (u0 < 0 || units < 0 || units > out_f - u0) die("weight gradient units out of range");
    KOP(r_dense_wu);
    o->i[PREC] = ctx_precision(ctx);
    o->p[0] = dw; o->p[1] = db; o->p[2] = (void *)dout; o->p[3] = (void *)in;
    o->i[0] = n; o->i[1] = in_f; o->i[2] = out_f; o->i[3] = u0; o->i[4] = units;
    DONE();
}
size_t kernel_conv2d_workspace_floats_cuda(const kernel_conv2d_dims *d)
{
    size_t cols = (size_t)d->n * kernel_conv2d_out_h(d) * kernel_conv2d_out_w(d);
    size_t gpu = ((size_t)d->c * d->size * d->size + (size_t)d->filters) * cols;
    size_t cpu = kernel_conv2d_workspace_floats(d);
    return gpu > cpu ? gpu : cpu;
}
static void r_conv_f(op *o)
{
    const int prec = o->i[PREC];
    float *ri = rounded(o->p[2], conv_in_count(&o->d), prec), *rw = rounded(o->p[3], conv_w_count(&o->d), prec);
    kernel_conv2d_forward_cpu(o->p[0], o->p[1], ri, rw, o->p[4], &o->d);
    unround(ri, o->p[2]); unround(rw, o->p[3]);
}
int kernel_conv2d_forward_cuda(float *out, float *work, const float *in, const float *w,
                               const float *b, const kernel_conv2d_dims *d,
                               const kernel_cuda_ctx *ctx)
{
    need_dev(out, "conv out"); need_dev(work, "work"); need_dev(in, "in"); need_dev(w, "w"); need_dev(b, "b");
    KOP(r_conv_f);
    o->i[PREC] = ctx_precision(ctx);
    o->p[0] = out; o->p[1] = work; o->p[2] = (void *)in; o->p[3] = (void *)w; o->p[4] = (void *)b; o->d = *d;
    DONE();
}
static void r_conv_b(op *o)
{
    if (o->i[PREC] == KERNEL_CUDA_FP32) {
        kernel_conv2d_backward_cpu(o->p[0], o->p[1], o->p[2], o->p[3], o->p[4], o->p[5], o->p[6], &o->d);
        return;
    }
    conv_weight(o->p[1], o->p[2], o->p[3], o->p[4], o->p[5], &o->d, o->i[PREC]);
    if (o->p[0]) conv_input(o->p[0], o->p[3], o->p[4], o->p[6], &o->d, o->i[PREC]);
}
int kernel_conv2d_backward_cuda(float *din, float *dw, float *db, float *work,
                                const float *dout, const float *in, const float *w,
                                const kernel_conv2d_dims *d, const kernel_cuda_ctx *ctx)
{
    need_dev(din, "conv din"); need_dev(dw, "dw"); need_dev(db, "db"); need_dev(work, "work"); need_dev(dout, "dout"); need_dev(in, "in"); need_dev(w, "w");
    KOP(r_conv_b);
    o->i[PREC] = ctx_precision(ctx);
    o->p[0] = din; o->p[1] = dw; o->p[2] = db; o->p[3] = work; o->p[4] = (void *)dout; o->p[5] = (void *)in; o->p[6] = (void *)w; o->d = *d;
    DONE();
}
static void r_conv_bw(op *o) { conv_weight(o->p[0], o->p[1], o->p[2], o->p[3], o->p[4], &o->d, o->i[PREC]); }
int kernel_conv2d_backward_weight_cuda(float *dw, float *db, float *work, const float *dout,
                                       const float *in, const kernel_conv2d_dims *d,
                                       const kernel_cuda_ctx *ctx)
{
    need_dev(dw, "dw"); need_dev(db, "db"); need_dev(work, "work"); need_dev(dout, "dout"); need_dev(in, "in");
    KOP(r_conv_bw);
    o->i[PREC] = ctx_precision(ctx);
    o->p[0] = dw; o->p[1] = db; o->p[2] = work; o->p[3] = (void *)dout; o->p[4] = (void *)in; o->d = *d;
    DONE();
}
static void r_conv_bi(op *o) { conv_input(o->p[0], o->p[1], o->p[2], o->p[3], &o->d, o->i[PREC]); }
int kernel_conv2d_backward_input_cuda(float *din, float *work, const float *dout,
                                      const float *w, const kernel_conv2d_dims *d,
                                      const kernel_cuda_ctx *ctx)
{
    need_dev(din, "conv din"); need_dev(work, "work"); need_dev(dout, "dout"); need_dev(w, "w");
    if (!din) die("conv input gradient without din");
    KOP(r_conv_bi);
    o->i[PREC] = ctx_precision(ctx);
    o->p[0] = din; o->p[1] = work; o->p[2] = (void *)dout; o->p[3] = (void *)w; o->d = *d;
    DONE();
}
static void r_maxf(op *o) { kernel_maxpool2d_forward_cpu(o->p[0], o->p[1], o->p[2], o->i[0], o->i[1], o->i[2], o->i[3], o->i[4], o->i[5]); }
int kernel_maxpool2d_forward_cuda(float *out, int32_t *argmax, const float *in, int n, int c,
                                  int h, int w, int size, int stride, const kernel_cuda_ctx *ctx)
{
    need_dev(out, "max out"); need_dev(argmax, "argmax"); need_dev(in, "in");
    KOP(r_maxf);
    o->p[0] = out; o->p[1] = argmax; o->p[2] = (void *)in;
    o->i[0] = n; o->i[1] = c; o->i[2] = h; o->i[3] = w; o->i[4] = size; o->i[5] = stride;
    DONE();
}
static void r_maxb(op *o) { kernel_maxpool2d_backward_cpu(o->p[0], o->p[1], o->p[2], o->i[0], o->i[1], o->i[2], o->i[3], o->i[4], o->i[5]); }
int kernel_maxpool2d_backward_cuda(float *din, const float *dout, const int32_t *argmax, int n,
                                   int c, int h, int w, int size, int stride,
                                   const kernel_cuda_ctx *ctx)
{
    need_dev(din, "max din"); need_dev(dout, "dout"); need_dev(argmax, "argmax");
    if (!din) die("maxpool backward without din");
    KOP(r_maxb);
    o->p[0] = din; o->p[1] = (void *)dout; o->p[2] = (void *)argmax;
    o->i[0] = n; o->i[1] = c; o->i[2] = h; o->i[3] = w; o->i[4] = size; o->i[5] = stride;
    DONE();
}
static void r_avgf(op *o) { kernel_avgpool2d_forward_cpu(o->p[0], o->p[1], o->i[0], o->i[1], o->i[2], o->i[3], o->i[4], o->i[5]); }
int kernel_avgpool2d_forward_cuda(float *out, const float *in, int n, int c, int h, int w,
                                  int size, int stride, const kernel_cuda_ctx *ctx)
{
    need_dev(out, "avg out"); need_dev(in, "in");
    KOP(r_avgf);
    o->p[0] = out; o->p[1] = (void *)in;
    o->i[0] = n; o->i[1] = c; o->i[2] = h; o->i[3] = w; o->i[4] = size; o->i[5] = stride;
    DONE();
}
static void r_avgb(op *o) { kernel_avgpool2d_backward_cpu(o->p[0], o->p[1], o->i[0], o->i[1], o->i[2], o->i[3], o->i[4], o->i[5]); }
int kernel_avgpool2d_backward_cuda(float *din, const float *dout, int n, int c, int h, int w,
                                   int size, int stride, const kernel_cuda_ctx *ctx)
{
    need_dev(din, "avg din"); need_dev(dout, "dout");
    if (!din) die("avgpool backward without din");
    KOP(r_avgb);
    o->p[0] = din; o->p[1] = (void *)dout;
    o->i[0] = n; o->i[1] = c; o->i[2] = h; o->i[3] = w; o->i[4] = size; o->i[5] = stride;
    DONE();
}
static void r_actf(op *o) { kernel_activation_forward_cpu(o->p[0], o->p[1], o->z[0], (kernel_act)o->i[0]); }
int kernel_activation_forward_cuda(float *out, const float *in, size_t count, kernel_act act,
                                   const kernel_cuda_ctx *ctx)
{
    need_dev(out, "act out"); need_dev(in, "act in");
    KOP(r_actf);
    o->p[0] = out; o->p[1] = (void *)in; o->z[0] = count; o->i[0] = act;
    DONE();
}
static void r_actb(op *o) { kernel_activation_backward_cpu(o->p[0], o->p[1], o->p[2], o->z[0], (kernel_act)o->i[0]); }
int kernel_activation_backward_cuda(float *din, const float *dout, const float *out,
                                    size_t count, kernel_act act, const kernel_cuda_ctx *ctx)
{
    need_dev(din, "actb din"); need_dev(dout, "dout"); need_dev(out, "out");
    KOP(r_actb);
    o->p[0] = din; o->p[1] = (void *)dout; o->p[2] = (void *)out; o->z[0] = count; o->i[0] = act;
    DONE();
}
static void r_dropf(op *o) { kernel_dropout_forward_range_cpu(o->p[0], o->p[1], o->p[2], o->i[0], o->z[0], o->z[1], o->f[0], o->u[0], o->u[1], o->p[3]); }
int kernel_dropout_forward_range_cuda(float *out, uint8_t *mask, const float *in, int n,
                                      size_t per_sample, size_t elem_off, float p,
                                      uint64_t seed, uint64_t stream,
                                      const int64_t *sample_ids, const kernel_cuda_ctx *ctx)
{
    need_dev(out, "drop out"); need_dev(mask, "mask"); need_dev(in, "in"); need_dev(sample_ids, "ids");
    const size_t limit = (size_t)1 << 32;
    if (n < 0 || per_sample > limit || elem_off > limit - per_sample)
        return pt_error_set("dropout: invalid sizes n=%d per_sample=%zu elem_off=%zu", n, per_sample, elem_off);
    if (!sample_ids) die("dropout without ids");
    KOP(r_dropf);
    o->p[0] = out; o->p[1] = mask; o->p[2] = (void *)in; o->p[3] = (void *)sample_ids;
    o->i[0] = n; o->z[0] = per_sample; o->z[1] = elem_off; o->f[0] = p; o->u[0] = seed; o->u[1] = stream;
    DONE();
}
int kernel_dropout_forward_cuda(float *out, uint8_t *mask, const float *in, int n,
                                size_t per_sample, float p, uint64_t seed, uint64_t stream,
                                const int64_t *sample_ids, const kernel_cuda_ctx *ctx)
{
    return kernel_dropout_forward_range_cuda(out, mask, in, n, per_sample, 0, p, seed, stream, sample_ids, ctx);
}
static void r_dropb(op *o) { kernel_dropout_backward_cpu(o->p[0], o->p[1], o->p[2], o->z[0], o->f[0]); }
int kernel_dropout_backward_cuda(float *din, const float *dout, const uint8_t *mask,
                                 size_t count, float p, const kernel_cuda_ctx *ctx)
{
    need_dev(din, "dropb din"); need_dev(dout, "dout"); need_dev(mask, "mask");
    KOP(r_dropb);
    o->p[0] = din; o->p[1] = (void *)dout; o->p[2] = (void *)mask; o->z[0] = count; o->f[0] = p;
    DONE();
}
static void r_xent(op *o)
{
    int ok = 0;
    double l = kernel_softmax_xent_cpu(o->p[0], &ok, o->p[3], o->p[4], o->i[0], o->i[1], o->f[0]);
    if (o->p[1]) *(int *)o->p[1] = ok;
    if (o->p[2]) *(double *)o->p[2] = l;
}
int kernel_softmax_xent_cuda(float *dlogits, int *correct, double *loss_sum,
                             const float *logits, const int32_t *labels, int n, int classes,
                             float grad_scale, const kernel_cuda_ctx *ctx)
{
    need_dev(dlogits, "dlogits"); need_dev(correct, "correct"); need_dev(loss_sum, "loss"); need_dev(logits, "logits"); need_dev(labels, "labels");
    KOP(r_xent);
    o->p[0] = dlogits; o->p[1] = correct; o->p[2] = loss_sum; o->p[3] = (void *)logits; o->p[4] = (void *)labels;
    o->i[0] = n; o->i[1] = classes; o->f[0] = grad_scale;
    DONE();
}
static void r_add(op *o) { kernel_add_cpu(o->p[0], o->p[1], o->z[0]); }
int kernel_add_cuda(float *dst, const float *src, size_t count, const kernel_cuda_ctx *ctx)
{
    need_dev(dst, "dst"); need_dev(src, "src");
    KOP(r_add);
    o->p[0] = dst; o->p[1] = (void *)src; o->z[0] = count;
    DONE();
}
static void r_sgd(op *o) { kernel_sgd_update_cpu(o->p[0], o->p[1], o->z[0], o->f[0], o->f[1]); }
int kernel_sgd_update_cuda(float *param, const float *grad, size_t count, float lr,
                           float weight_decay, const kernel_cuda_ctx *ctx)
{
    need_dev(param, "param"); need_dev(grad, "grad");
    KOP(r_sgd);
    o->p[0] = param; o->p[1] = (void *)grad; o->z[0] = count; o->f[0] = lr; o->f[1] = weight_decay;
    DONE();
}
static void r_mom(op *o) { kernel_momentum_update_cpu(o->p[0], o->p[1], o->p[2], o->z[0], o->f[0], o->f[1], o->f[2]); }
int kernel_momentum_update_cuda(float *param, float *buf, const float *grad, size_t count,
                                float lr, float momentum, float weight_decay,
                                const kernel_cuda_ctx *ctx)
{
    need_dev(param, "param"); need_dev(buf, "buf"); need_dev(grad, "grad");
    KOP(r_mom);
    o->p[0] = param; o->p[1] = buf; o->p[2] = (void *)grad; o->z[0] = count;
    o->f[0] = lr; o->f[1] = momentum; o->f[2] = weight_decay;
    DONE();
}
static void r_adam(op *o) { kernel_adam_update_cpu(o->p[0], o->p[1], o->p[2], o->p[3], o->z[0], o->f[0], o->f[1], o->f[2], o->f[3], o->f[4], o->l); }
int kernel_adam_update_cuda(float *param, float *m, float *v, const float *grad, size_t count,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            long step, const kernel_cuda_ctx *ctx)
{
    need_dev(param, "param"); need_dev(m, "m"); need_dev(v, "v"); need_dev(grad, "grad");
    if (count && step < 1) return pt_error_set("adam: step %ld, must start at 1", step);
    KOP(r_adam);
    o->p[0] = param; o->p[1] = m; o->p[2] = v; o->p[3] = (void *)grad; o->z[0] = count;
    o->f[0] = lr; o->f[1] = beta1; o->f[2] = beta2; o->f[3] = eps; o->f[4] = weight_decay; o->l = step;
    DONE();
}
static void r_adamw(op *o) { kernel_adamw_update_cpu(o->p[0], o->p[1], o->p[2], o->p[3], o->z[0], o->f[0], o->f[1], o->f[2], o->f[3], o->f[4], o->l); }
int kernel_adamw_update_cuda(float *param, float *m, float *v, const float *grad, size_t count,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             long step, const kernel_cuda_ctx *ctx)
{
    need_dev(param, "param"); need_dev(m, "m"); need_dev(v, "v"); need_dev(grad, "grad");
    if (count && step < 1) return pt_error_set("adamw: step %ld, must start at 1", step);
    KOP(r_adamw);
    o->p[0] = param; o->p[1] = m; o->p[2] = v; o->p[3] = (void *)grad; o->z[0] = count;
    o->f[0] = lr; o->f[1] = beta1; o->f[2] = beta2; o->f[3] = eps; o->f[4] = weight_decay; o->l = step;
    DONE();
}
static void r_init(op *o) { kernel_init_uniform_range_cpu(o->p[0], o->z[0], o->z[1], o->f[0], o->u[0], o->u[1]); }
int kernel_init_uniform_range_cuda(float *out, size_t first, size_t count, float bound,
                                   uint64_t seed, uint64_t stream, const kernel_cuda_ctx *ctx)
{
    need_dev(out, "init out");
    if (count && (first > SIZE_MAX / 4 || count > SIZE_MAX / 4))
        return pt_error_set("init_uniform: invalid range first=%zu count=%zu", first, count);
    KOP(r_init);
    o->p[0] = out; o->z[0] = first; o->z[1] = count; o->f[0] = bound; o->u[0] = seed; o->u[1] = stream;
    DONE();
}
int kernel_init_uniform_cuda(float *out, size_t count, float bound, uint64_t seed,
                             uint64_t stream, const kernel_cuda_ctx *ctx)
{
    return kernel_init_uniform_range_cuda(out, 0, count, bound, seed, stream, ctx);
}
static void r_bias(op *o)
{
    float *y = o->p[0];
    const float *b = o->p[1];
    const size_t per = o->z[0];
    for (int i = 0; i < o->i[0]; i++)
        for (int u = 0; u < o->i[1]; u++) {
            float *v = y + ((size_t)i * o->i[1] + u) * per;
            for (size_t k = 0; k < per; k++) v[k] += b[u];
        }
}
int kernel_bias_add_cuda(float *y, const float *b, int n, int units, size_t per,
                         const kernel_cuda_ctx *ctx)
{
    need_dev(y, "bias y"); need_dev(b, "bias b");
    if (n < 0 || units < 0) return pt_error_set("bias_add: invalid sizes n=%d units=%d", n, units);
    if ((!y || !b) && n > 0 && units > 0 && per > 0) die("bias add without y or b");
    KOP(r_bias);
    o->p[0] = y; o->p[1] = (void *)b; o->i[0] = n; o->i[1] = units; o->z[0] = per;
    DONE();
}
static void r_b2f(op *o) { kernel_bytes_to_float_cpu(o->p[0], o->p[1], o->z[0]); }
int kernel_bytes_to_float_cuda(float *out, const uint8_t *in, size_t count,
                               const kernel_cuda_ctx *ctx)
{
    need_dev(out, "b2f out"); need_dev(in, "b2f in");
    KOP(r_b2f);
    o->p[0] = out; o->p[1] = (void *)in; o->z[0] = count;
    DONE();
}


/* The transformer layers' twins (issue 25): part of this file, kept apart for its size. */
#include "tests/cuda/mock_cuda_transformer.c"
#include "tests/cuda/mock_cuda_vmm.c"
