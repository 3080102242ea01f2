/* bf16 matrix products through oneDNN's matmul (kernels/bf16.h). */
#include "kernels/bf16.h"

#include <dlfcn.h>
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "src/base/error.h"

/* One product C[m, n] (+)= A[m, k] · B[k, n] of bf16 operands into float32: A stored
 * transposed (k rows of m) when ta, B when tb; a float32 bias row added, or C's old values
 * (acc, oneDNN's sum post-op). */
typedef struct {
    int ta, tb, m, n, k, bias, acc;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, bias_mem;
} product;

enum { PRODUCTS = 48 }; /* a stage's shapes: a few per layer and chunk size */

typedef struct {
    dnnl_stream_t stream;
    product prod[PRODUCTS];
    int n_prod, next;   /* the next one replaced when all are taken */
    uint16_t *buf[2];   /* the rounded operands */
    size_t cap[2];
} thread_state;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_key_t state_key;
static dnnl_engine_t engine;
static char init_error[160];

static void product_free(product *p)
{
    dnnl_primitive_destroy(p->prim);
    dnnl_memory_destroy(p->a);
    dnnl_memory_destroy(p->b);
    dnnl_memory_destroy(p->c);
    dnnl_memory_destroy(p->bias_mem);
    memset(p, 0, sizeof *p);
}

static void thread_state_free(void *arg)
{
    thread_state *t = arg;
    for (int i = 0; i < t->n_prod; i++) product_free(&t->prod[i]);
    dnnl_stream_destroy(t->stream);
    free(t->buf[0]);
    free(t->buf[1]);
    free(t);
}

static void init_once(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16"))
        snprintf(init_error, sizeof init_error,
                 "this CPU has no AVX512_BF16 (bf16 products need it)");
    else if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success)
        snprintf(init_error, sizeof init_error, "oneDNN could not create its CPU engine");
    else if (pthread_key_create(&state_key, thread_state_free))
        snprintf(init_error, sizeof init_error, "out of thread keys");
}

static thread_state *state(void)
{
    pthread_once(&once, init_once);
    if (*init_error) {
        pt_error_set("--precision bf16 on the CPU: %s", init_error);
        return NULL;
    }
    thread_state *t = pthread_getspecific(state_key);
    if (t) return t;
    t = calloc(1, sizeof *t);
    if (!t || dnnl_stream_create(&t->stream, engine, dnnl_stream_default_flags) != dnnl_success) {
        free(t);
        pt_error_set("bf16 products: out of memory for a thread's oneDNN stream");
        return NULL;
    }
    /* one thread per product: the stage's workers split the micro-batch themselves. Debian's
     * oneDNN sizes each product's team by this thread's OpenMP setting (libgomp, loaded with
     * it, is found at run time: no link to an OpenMP runtime of the compiler's choosing). */
    void (*set_threads)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    if (set_threads) set_threads(1);
    if (pthread_setspecific(state_key, t)) {
        thread_state_free(t);
        pt_error_set("bf16 products: out of thread-specific memory");
        return NULL;
    }
    return t;
}

int kernel_bf16_available(void)
{
    if (!state()) return 0;
    /* a first product proves oneDNN runs one here */
    float a[2] = {1.5f, -2.0f}, c[1] = {0};
    if (kernel_dense_forward_bf16(c, a, a, NULL, 1, 2, 1)) return 0;
    if (c[0] != 6.25f) {
        pt_error_set("--precision bf16 on the CPU: oneDNN's bf16 product gave %g for 6.25",
                     (double)c[0]);
        return 0;
    }
    return 1;
}

/* dst = bf16(src), to nearest even (VCVTNEPS2BF16; it flushes denormals). Called only with
 * a thread state, which exists only where the CPU has AVX512_BF16 (init_once): the one
 * AVX-512 function of a portable build (experiments/cuda/bundle.sh checks that). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
round_rows_avx512bf16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)v);
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, (__m256i)v);
    }
}

/* The thread's buffer `which`, holding src rounded (n floats; src NULL: only sized). */
static const uint16_t *rounded(thread_state *t, int which, const float *src, size_t n)
{
    if (t->cap[which] < n) {
        uint16_t *p = realloc(t->buf[which], n * sizeof *p);
        if (!p) {
            pt_error_set("bf16 products: out of memory for %zu rounded operands", n);
            return NULL;
        }
        t->buf[which] = p;
        t->cap[which] = n;
    }
    if (src) round_rows_avx512bf16(t->buf[which], src, n);
    return t->buf[which];
}

static int md_init(dnnl_memory_desc_t *md, int rows, int cols, dnnl_data_type_t type, int trans)
{
    dnnl_dims_t d = {rows, cols};
    return dnnl_memory_desc_init_by_tag(md, 2, d, type, trans ? dnnl_ba : dnnl_ab) !=
           dnnl_success;
}

static int product_make(product *p)
{
    dnnl_memory_desc_t a, b, c, bias;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int bad = md_init(&a, p->m, p->k, dnnl_bf16, p->ta) ||
              md_init(&b, p->k, p->n, dnnl_bf16, p->tb) ||
              md_init(&c, p->m, p->n, dnnl_f32, 0) || md_init(&bias, 1, p->n, dnnl_f32, 0) ||
              dnnl_matmul_desc_init(&desc, &a, &b, p->bias ? &bias : NULL, &c) ||
              dnnl_primitive_attr_create(&attr);
    if (!bad && p->acc)
        bad = dnnl_post_ops_create(&ops) || dnnl_post_ops_append_sum(ops, 1.0f) ||
              dnnl_primitive_attr_set_post_ops(attr, ops);
    bad = bad || dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL) ||
          dnnl_primitive_create(&p->prim, pd) ||
          dnnl_memory_create(&p->a, &a, engine, DNNL_MEMORY_NONE) ||
          dnnl_memory_create(&p->b, &b, engine, DNNL_MEMORY_NONE) ||
          dnnl_memory_create(&p->c, &c, engine, DNNL_MEMORY_NONE) ||
          dnnl_memory_create(&p->bias_mem, &bias, engine, DNNL_MEMORY_NONE);
    dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(ops);
    dnnl_primitive_attr_destroy(attr);
    if (bad) {
        product_free(p);
        return pt_error_set("oneDNN refused a bf16 product of %d×%d by %d×%d", p->m, p->k,
                            p->k, p->n);
    }
    return 0;
}

/* The thread's primitive for this shape, made on first use. */
static product *product_for(thread_state *t, product key)
{
    for (int i = 0; i < t->n_prod; i++) {
        product *p = &t->prod[i];
        if (p->ta == key.ta && p->tb == key.tb && p->m == key.m && p->n == key.n &&
            p->k == key.k && p->bias == key.bias && p->acc == key.acc)
            return p;
    }
    product *p;
    if (t->n_prod < PRODUCTS) {
        p = &t->prod[t->n_prod++];
    } else {
        p = &t->prod[t->next];
        t->next = (t->next + 1) % PRODUCTS;
        product_free(p);
    }
    *p = key;
    if (product_make(p)) {
        *p = t->prod[--t->n_prod]; /* the last one takes the failed one's place */
        return NULL;
    }
    return p;
}

static int matmul(thread_state *t, product key, const uint16_t *a, const uint16_t *b, float *c,
                  const float *bias)
{
    key.bias = bias != NULL;
    product *p = product_for(t, key);
    if (!p) return -1;
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b},
                               {DNNL_ARG_DST, p->c}, {DNNL_ARG_BIAS, p->bias_mem}};
    if (dnnl_memory_set_data_handle(p->a, (void *)a) ||
        dnnl_memory_set_data_handle(p->b, (void *)b) || dnnl_memory_set_data_handle(p->c, c) ||
        (bias && dnnl_memory_set_data_handle(p->bias_mem, (void *)bias)) ||
        dnnl_primitive_execute(p->prim, t->stream, bias ? 4 : 3, args) ||
        dnnl_stream_wait(t->stream))
        return pt_error_set("oneDNN failed a bf16 product of %d×%d by %d×%d", p->m, p->k, p->k,
                            p->n);
    return 0;
}

int kernel_gemm_bf16(int ta, int tb, int m, int n, int k, const float *A, const float *B,
                     float *C, const float *bias, int acc)
{
    thread_state *t = state();
    const uint16_t *a = t ? rounded(t, 0, A, (size_t)m * k) : NULL,
                   *b = a ? rounded(t, 1, B, (size_t)k * n) : NULL;
    product key = {.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .acc = acc};
    return b ? matmul(t, key, a, b, C, bias) : -1;
}

int kernel_dense_forward_bf16(float *out, const float *in, const float *w, const float *b,
                              int n, int in_f, int out_f)
{
    return kernel_gemm_bf16(0, 1, n, out_f, in_f, in, w, out, b, 0);
}

/* dw += bf16(dout)^T · bf16(in) from dout already rounded in buffer 0. */
static int weight_half(thread_state *t, float *dw, float *db, const uint16_t *g,
                       const float *dout, const float *in, int n, int in_f, int out_f)
{
    const uint16_t *x = rounded(t, 1, in, (size_t)n * in_f);
    product key = {.ta = 1, .tb = 0, .m = out_f, .n = in_f, .k = n, .acc = 1};
    if (!x || matmul(t, key, g, x, dw, NULL)) return -1;
    if (db) kernel_dense_bias_grad_cpu(db, dout, n, out_f, 0, out_f); /* of the unrounded dout */
    return 0;
}

static int input_half(thread_state *t, float *din, const uint16_t *g, const float *w, int n,
                      int in_f, int out_f)
{
    const uint16_t *wr = rounded(t, 1, w, (size_t)out_f * in_f);
    product key = {.ta = 0, .tb = 0, .m = n, .n = in_f, .k = out_f};
    return wr ? matmul(t, key, g, wr, din, NULL) : -1;
}

int kernel_dense_backward_weight_bf16(float *dw, float *db, const float *dout, const float *in,
                                      int n, int in_f, int out_f)
{
    thread_state *t = state();
    const uint16_t *g = t ? rounded(t, 0, dout, (size_t)n * out_f) : NULL;
    return g ? weight_half(t, dw, db, g, dout, in, n, in_f, out_f) : -1;
}

int kernel_dense_backward_input_bf16(float *din, const float *dout, const float *w, int n,
                                     int in_f, int out_f)
{
    thread_state *t = state();
    const uint16_t *g = t ? rounded(t, 0, dout, (size_t)n * out_f) : NULL;
    return g ? input_half(t, din, g, w, n, in_f, out_f) : -1;
}

int kernel_dense_weight_grad_units_bf16(float *dw, float *db, const float *dout, const float *in,
                                        int n, int in_f, int out_f, int u0, int units)
{
    if (n == 0) { /* no rows: zeros, as sgemm gives */
        memset(dw + (size_t)u0 * in_f, 0, (size_t)units * in_f * sizeof *dw);
        if (db) memset(db + u0, 0, (size_t)units * sizeof *db);
        return 0;
    }
    thread_state *t = state();
    /* the tile's columns of dout, rounded into n rows of `units` */
    const uint16_t *g = t ? rounded(t, 0, NULL, (size_t)n * units) : NULL;
    if (!g) return -1;
    for (int i = 0; i < n; i++)
        round_rows_avx512bf16(t->buf[0] + (size_t)i * units, dout + (size_t)i * out_f + u0,
                              (size_t)units);
    const uint16_t *x = rounded(t, 1, in, (size_t)n * in_f);
    product key = {.ta = 1, .tb = 0, .m = units, .n = in_f, .k = n};
    if (!x || matmul(t, key, g, x, dw + (size_t)u0 * in_f, NULL)) return -1;
    if (!db) return 0;
    memset(db + u0, 0, (size_t)units * sizeof *db);
    kernel_dense_bias_grad_cpu(db, dout, n, out_f, u0, units);
    return 0;
}

int kernel_dense_backward_bf16(float *din, float *dw, float *db, const float *dout,
                               const float *in, const float *w, int n, int in_f, int out_f)
{
    thread_state *t = state();
    const uint16_t *g = t ? rounded(t, 0, dout, (size_t)n * out_f) : NULL;
    if (!g || weight_half(t, dw, db, g, dout, in, n, in_f, out_f)) return -1;
    return din ? input_half(t, din, g, w, n, in_f, out_f) : 0;
}
