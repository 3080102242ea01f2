/* Fully connected layer, as torch.nn.functional.linear, through CBLAS. */
#include "kernels/kernels.h"

#include <cblas.h>
#include <string.h>

/* OpenBLAS's: declared here, since <cblas.h> may be another BLAS's (Debian's alternatives) */
void openblas_set_num_threads(int);
int openblas_get_num_threads(void);

int kernel_blas_threads(int n)
{
    int had = openblas_get_num_threads();
    openblas_set_num_threads(n);
    return had;
}

void kernel_dense_forward_cpu(float *out, const float *in, const float *w, const float *b,
                              int n, int in_f, int out_f)
{
    /* Broadcast the bias into out, then let one sgemm accumulate onto it (beta = 1): this
     * saves a second pass over out, which matters for small layers. */
    if (b) {
        for (int i = 0; i < n; i++)
            memcpy(out + (size_t)i * out_f, b, (size_t)out_f * sizeof *out);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out_f, in_f, 1.0f, in, in_f, w,
                in_f, b ? 1.0f : 0.0f, out, out_f);
}

void kernel_dense_backward_weight_cpu(float *dw, float *db, const float *dout, const float *in,
                                      int n, int in_f, int out_f)
{
    /* dw[out_f, in_f] += dout^T · in. */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out_f, in_f, n, 1.0f, dout, out_f,
                in, in_f, 1.0f, dw, in_f);
    if (db) kernel_dense_bias_grad_cpu(db, dout, n, out_f, 0, out_f);
}

void kernel_dense_bias_grad_cpu(float *db, const float *dout, int n, int out_f, int u0,
                                int units)
{
    /* Column sums row by row: the inner loop runs along contiguous memory and vectorises. */
    for (int i = 0; i < n; i++) {
        const float *row = dout + (size_t)i * out_f + u0;
        for (int j = 0; j < units; j++) db[u0 + j] += row[j];
    }
}

void kernel_dense_backward_input_cpu(float *din, const float *dout, const float *w, int n,
                                     int in_f, int out_f)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in_f, out_f, 1.0f, dout, out_f,
                w, in_f, 0.0f, din, in_f);
}

void kernel_dense_backward_cpu(float *din, float *dw, float *db, const float *dout,
                               const float *in, const float *w, int n, int in_f, int out_f)
{
    kernel_dense_backward_weight_cpu(dw, db, dout, in, n, in_f, out_f);
    if (din) kernel_dense_backward_input_cpu(din, dout, w, n, in_f, out_f);
}

void kernel_dense_weight_grad_units_cpu(float *dw, float *db, const float *dout, const float *in,
                                        int n, int in_f, int out_f, int u0, int units)
{
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, units, in_f, n, 1.0f, dout + u0, out_f,
                in, in_f, 0.0f, dw + (size_t)u0 * in_f, in_f);
    if (!db) return;
    memset(db + u0, 0, (size_t)units * sizeof *db);
    kernel_dense_bias_grad_cpu(db, dout, n, out_f, u0, units);
}
