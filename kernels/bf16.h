/* bf16 matrix products on the CPU (--precision bf16 with --device cpu): the dense layers'
 * products (forward and both backward halves, and so a transformer block's four) and a
 * convolution's three (kernel_conv2d_dims.bf16) with their operands rounded to bfloat16 and
 * their sums in float32, as the CUDA engine's bf16 does. Debian's OpenBLAS has no bf16 GEMM;
 * oneDNN's matmul runs them on AMX tiles or AVX512_BF16 dot products (docs/PERFORMANCE.md,
 * "bf16 products on the CPU"). Everything else (weights, gradients, optimizer state, biases,
 * norms, attention, the loss, messages, checkpoints) stays float32.
 *
 * Rounding: to nearest even, with denormal inputs flushed to zero, as VCVTNEPS2BF16 does.
 * The results are the same bits for the same shapes and values on one machine (oneDNN picks
 * its kernel from the shapes alone), so every layout of a run gives the bits of one process,
 * as fp32 does. Each thread keeps its own stream, primitives and conversion buffers. */
#ifndef PT_KERNELS_BF16_H
#define PT_KERNELS_BF16_H

/* 1 where this CPU has AVX512_BF16 and oneDNN gives a bf16 matmul; else 0 with pt_error
 * saying why. */
int kernel_bf16_available(void);

/* C[m, n] = bf16(A) · bf16(B) (+ bias row, + C where acc), A stored transposed (k rows of
 * m) where ta and B (n rows of k) where tb, all contiguous (the convolutions' products). */
int kernel_gemm_bf16(int ta, int tb, int m, int n, int k, const float *A, const float *B,
                     float *C, const float *bias, int acc);
/* out[n, out_f] = bf16(in) · bf16(w)^T + b (b may be NULL). */
int kernel_dense_forward_bf16(float *out, const float *in, const float *w, const float *b,
                              int n, int in_f, int out_f);
/* dw += bf16(dout)^T · bf16(in), db += Σ_n dout (float32). */
int kernel_dense_backward_weight_bf16(float *dw, float *db, const float *dout, const float *in,
                                      int n, int in_f, int out_f);
/* din = bf16(dout) · bf16(w). */
int kernel_dense_backward_input_bf16(float *din, const float *dout, const float *w, int n,
                                     int in_f, int out_f);
/* The weight gradient of output units [u0, u0 + units) alone, written (not added), as
 * kernel_dense_weight_grad_units_cpu: dw[u0.., :] = bf16(dout[:, u0..])^T · bf16(in), db[u0..]
 * float32 column sums of dout (the batched weight gradients, --wgrad batched). */
int kernel_dense_weight_grad_units_bf16(float *dw, float *db, const float *dout, const float *in,
                                        int n, int in_f, int out_f, int u0, int units);
/* Both halves, dout rounded once (din may be NULL). */
int kernel_dense_backward_bf16(float *din, float *dw, float *db, const float *dout,
                               const float *in, const float *w, int n, int in_f, int out_f);

#endif
