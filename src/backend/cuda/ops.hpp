#pragma once
// The CUDA op set: the twin of backend/cpu/ops.hpp, op for op and in the same order, on device
// pointers. Each op is in the .cu file named like its CPU twin (layernorm.cu beside
// layernorm.cpp) and tests/gpu compares every one with the CPU op.
//
// Same signatures as the CPU ops, with two rules:
//  - F is float or bf16 (__nv_bfloat16) instead of float or double. For F = float every signature
//    is the CPU one exactly.
//  - What must stay fp32 in mixed precision is fp32 in every instantiation: parameter gradients
//    (dwte, dwpe, dweight, dbias: summed over micro-batches, "fp32 gradient accumulation"), the
//    LayerNorm and RMSNorm statistics, the RoPE table, the cross-entropy's row max and losses,
//    AdamW's master weights and moments. Activations, their gradients and the parameters the
//    GEMMs read are F.
// All arithmetic is fp32 (fp64 where the CPU op sums in double); bf16 is a storage format.
//
// Every op is asynchronous on the backend's stream (device/context.hpp: stream()), the stream the
// cuBLAS handle is bound to, so ops run in call order; "accumulates" means ADDS into its output,
// as on the CPU.
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/adafactor.hpp"
#include "backend/adamw.hpp"
#include "backend/arena.hpp"
#include "backend/attention_block.hpp"
#include "backend/moe_routing.hpp"
#include "common/fp8_format.hpp"

namespace tessera::cuda {

using bf16 = __nv_bfloat16;

// C (M,N) = alpha * op(A) · op(B) + beta * C, row-major with leading dimensions, through
// cublasGemmEx with fp32 accumulation (fp32: CUBLAS_COMPUTE_32F, no TF32, for parity with the
// CPU; bf16: tensor cores). beta == 0 ignores what C held (NaN included).
template <typename F>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const F* A, int lda,
          const F* B, int ldb, float beta, F* C, int ldc);

// out (B,T,C) = wte[tokens[b,t] - v0, :] + wpe[pos(b,t), :]; tokens (B,T) on the device; wte
// (vcount,C) holds rows [v0, v0 + vcount) of the vocabulary, other tokens contribute 0
// (vocab-parallel); wpe (rows,C) or nullptr; pos(b,t) = positions[b*T + t] (device memory), or t
// when positions is nullptr.
template <typename F>
void encoder_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T, int C,
                     int v0, int vcount, const int32_t* positions = nullptr);
// Accumulates dwte (vcount,C) for tokens in [v0, v0 + vcount) and dwpe (rows,C) unless nullptr
// (by the forward's positions), from dout (B,T,C). Deterministic: no atomics.
template <typename F>
void encoder_backward(float* dwte, float* dwpe, const F* dout, const int32_t* tokens, int B, int T,
                      int C, int v0, int vcount, const int32_t* positions = nullptr);
// out, inp (N,C); weight, bias (C); mean, rstd (N) saved for backward. eps = 1e-5 as torch.
template <typename F>
void layernorm_forward(F* out, float* mean, float* rstd, const F* inp, const F* weight,
                       const F* bias, int N, int C);
// Accumulates dinp (N,C), dweight (C), dbias (C).
template <typename F>
void layernorm_backward(F* dinp, float* dweight, float* dbias, const F* dout, const F* inp,
                        const F* weight, const float* mean, const float* rstd, int N, int C);
// RMSNorm as LLaMA's (torch: x * rsqrt(mean(x²) + eps) * weight): out, inp (N,C); weight (C);
// rstd (N) = 1/sqrt(mean(x²) + eps) saved for backward.
template <typename F>
void rmsnorm_forward(F* out, float* rstd, const F* inp, const F* weight, int N, int C, double eps);
// Accumulates dinp (N,C), dweight (C).
template <typename F>
void rmsnorm_backward(F* dinp, float* dweight, const F* dout, const F* inp, const F* weight,
                      const float* rstd, int N, int C);

// model.qk_norm's per-head RMSNorm of qkv's q and k heads in place (cpu::qk_norm_forward and
// qk_norm_backward state them): raw (N, (NH+NKV)*hs) the heads before it, rstd (N, NH+NKV);
// the backward replaces dqkv's q and k heads' gradients in place and accumulates dweight (2 hs).
template <typename F>
void qk_norm_forward(F* qkv, F* raw, float* rstd, const F* weight, int N, int NH, int NKV, int hs,
                     double eps);
template <typename F>
void qk_norm_backward(F* dqkv, float* dweight, const F* raw, const F* weight, const float* rstd,
                      int N, int NH, int NKV, int hs);

// out (N,OC) = inp (N,IC) · weightᵀ + bias; weight (OC,IC) as torch nn.Linear; bias (OC) or nullptr.
template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int N, int IC, int OC);
// out (N,OC) += bias (OC), for row-parallel layers whose partial products are summed first.
template <typename F>
void bias_add(F* out, const F* bias, int N, int OC);
// Accumulates dinp (N,IC) += dout·weight, dweight (OC,IC) += doutᵀ·inp, dbias (OC) += colsum(dout).
// dinp and dbias may be nullptr (skipped).
template <typename F>
void matmul_backward(F* dinp, float* dweight, float* dbias, const F* dout, const F* inp,
                     const F* weight, int N, int IC, int OC);
// A mixture of experts' `held` linear layers, each on its block of rows (backend/cpu/ops.hpp):
// expert e's rows start at offsets[e], counts[e] of them (host arrays). One cuBLAS GEMM per
// expert and product, or with device::grouped_experts() (device.expert_gemm: grouped) one
// cublasGemmGroupedBatchedEx over the experts per product; the bf16 weight gradient (bf16
// operands into an fp32 sum) is a type combination the grouped call lacks: one GEMM per expert.
// grouped_gemm_calls: cublasGemmGroupedBatchedEx calls since the process started (the tests'
// evidence that grouped ran).
long grouped_gemm_calls();
template <typename F>
void experts_forward(F* out, const F* inp, const F* weight, const F* bias, const int* counts,
                     const int* offsets, int held, int IC, int OC);
template <typename F>
void experts_backward(F* dinp, float* dweight, float* dbias, const F* dout, const F* inp,
                      const F* weight, const int* counts, const int* offsets, int held, int IC,
                      int OC);
// dbias (OC) += colsum(dout (N,OC)): matmul_backward's bias gradient alone (the FP8 GEMMs take
// the bias gradient from the unquantized output gradient).
template <typename F>
void bias_backward(float* dbias, const F* dout, int N, int OC);

// FP8 GEMMs (fp8.cu; twins of backend/cpu/fp8.cpp, common/fp8_format.hpp is the format).
// fp8_amax: max |x| over n, NaN if any is, returned to the host (a wait on the stream).
// fp8_cast: the codes of in (rows, cols) * scale by CUDA's own conversion (cuda_fp8.h: round to
// nearest even, saturating) into out (rows, cols) and out_t (cols, rows), either may be
// nullptr, in one pass that also folds max |in| into *amax (device; NaN sticks) and writes
// *scale_inv = 1 / scale (device), the operand's scale for the GEMM.
// fp8_place: codes already cast (in, rows x cols) copied to out and transposed into out_t, and
// *scale_inv_slot = scale_inv (device): fp8_cast's two outputs from codes that ZeRO-3 gathered
// (optim/sharded_weights.hpp).
// fp8_gemm: d (M,N) = x.scale_inv y.scale_inv · X (M,K) · Y (N,K)ᵀ [+ d where accumulate]
// [+ bias (N) per row], fp32 sums, d in D (F or fp32). cuBLASLt's FP8 GEMM where it takes the
// shape (bf16 bias, M, N, K multiples of 16, 16-byte aligned), else tessera's tiled kernel.
// fp8_lt_gemms: how many of them cuBLASLt ran since the process started; fp8_report: a log line
// of how many ran where ("" before the first).
template <typename F>
float fp8_amax(const F* x, size_t n);
template <typename F>
void fp8_cast(uint8_t* out, uint8_t* out_t, const F* in, int rows, int cols, float scale,
              Fp8Format format, float* amax, float* scale_inv);
void fp8_place(uint8_t* out, uint8_t* out_t, const uint8_t* in, int rows, int cols, float scale_inv,
               float* scale_inv_slot);
template <typename D, typename F>
void fp8_gemm(D* d, const Fp8Operand& x, const Fp8Operand& y, int M, int N, int K, const F* bias,
              bool accumulate);
long fp8_lt_gemms();
std::string fp8_report();

// Grouped-query attention on the qkv activation (B,T,(NH+2*NKV)*hs) of backend/cpu/ops.hpp (q
// heads, k heads, v heads; query head h reads kv head h / (NH/NKV)).
// att (B,NH,T,T) = causal softmax(q·kᵀ/sqrt(hs)), exactly 0 above the diagonal.
// out (B,T,NH*hs) = att·v, query head h in cols [h*hs,(h+1)*hs). Overwrites out and att.
// doc_start (B,T, device memory) or nullptr: each query's document start, as the CPU's.
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int NH, int NKV, int hs,
                       const int32_t* doc_start = nullptr);
// Accumulates dqkv from dout (B,T,NH*hs); a kv head's dk and dv sum over its query heads in a
// fixed order (no atomics); datt (B,NH,T,T) is scratch, overwritten.
template <typename F>
void attention_backward(F* dqkv, F* datt, const F* dout, const F* qkv, const F* att, int B, int T,
                        int NH, int NKV, int hs);
// The same attention without the (B,NH,T,T) matrix (model.attention: fused; flash-attention
// style: tiles of q, k and v in shared memory, an online softmax in fp32, the masked tiles
// skipped): the forward saves lse (B,NH,T, fp32), each query row's log-sum-exp of its scaled
// scores, and overwrites out and lse; the backward recomputes the probabilities from q, k and lse
// and accumulates dqkv from dout, using out of the forward. Head sizes up to
// limits::kFusedHeadSize (common/limits.hpp); deterministic (no atomics).
template <typename F>
void attention_fused_forward(F* out, float* lse, const F* qkv, int B, int T, int NH, int NKV,
                             int hs, const int32_t* doc_start = nullptr);
template <typename F>
void attention_fused_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const float* lse,
                              int B, int T, int NH, int NKV, int hs, const int32_t* doc_start = nullptr);

// Context parallelism (model/context_attention.hpp): one block of causal attention, its shape
// in backend/attention_block.hpp, the fused kernels' tiles on the block's strides. The forward
// merges the block into out and lse (fp32) by log-sum-exp (start them at 0 and -inf);
// attention_delta gives delta (B,NH,T, fp32) = Σ_c dout ∘ out per query head, rows ldo apart; the
// backward accumulates dq and the block's dk, dv (in dkv, kv's layout) from dout with the final
// lse and delta. Deterministic (no atomics).
template <typename F>
void attention_block_forward(F* out, float* lse, const F* q, const F* kv, const AttentionBlock& s);
template <typename F>
void attention_delta(float* delta, const F* dout, const F* out, int B, int T, int NH, int hs,
                     int ldo);
template <typename F>
void attention_block_backward(F* dq, F* dkv, const F* dout, const float* delta, const F* q,
                              const F* kv, const float* lse, const AttentionBlock& s);

// Rotary position embeddings in place on the q and k heads of qkv, by the fp32 table cs
// (T, hs/2, 2) in device memory (cpu::rope_table fills it on the host); the v heads untouched.
// The backward applies the transposed rotation to dqkv in place.
template <typename F>
void rope_forward(F* qkv, const float* cs, int B, int T, int NH, int NKV, int hs);
template <typename F>
void rope_backward(F* dqkv, const float* cs, int B, int T, int NH, int NKV, int hs);

// Mixture of experts (moe.cu; twins of backend/cpu/moe.cpp, which states each op; the rule in
// backend/moe_routing.hpp). Logits and rows in F, the router's scores, gates, their gradients
// and the auxiliary loss's aux (E) fp32; stats (E+1) doubles in device memory.
template <typename F>
void moe_route_forward(int32_t* expert, float* gates, float* scores, const F* logits,
                       const float* bias, int N, const MoeRouting& r);
template <typename F>
void moe_route_backward(F* dlogits, const float* dgates, const F* logits, const float* scores,
                        const int32_t* expert, const float* aux, double z_coef, int N,
                        const MoeRouting& r);
template <typename F>
void moe_router_stats(double* stats, const F* logits, const float* scores, int N,
                      const MoeRouting& r);
template <typename F>
void moe_gather_rows(F* out, const F* in, const int32_t* rows, int n, int C);
template <typename F>
void moe_combine(F* out, const F* rows, const int32_t* slot_of, const float* gates, int N, int k,
                 int C, bool accumulate);
template <typename F>
void moe_combine_backward(F* drows, float* dgates, const F* dout, const F* rows,
                          const int32_t* slot_of, const float* gates, int N, int k, int C);

// out, inp (n): GELU, tanh form as torch GELU(approximate='tanh').
template <typename F>
void gelu_forward(F* out, const F* inp, size_t n);
// Accumulates dinp (n).
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n);
// SwiGLU: inp (N,2H) = (gate | up); out (N,H) = silu(gate) * up. Overwrites out.
template <typename F>
void swiglu_forward(F* out, const F* inp, int N, int H);
// Accumulates dinp (N,2H) from dout (N,H).
template <typename F>
void swiglu_backward(F* dinp, const F* inp, const F* dout, int N, int H);

// out = a + b, all (n).
template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n);
// dst (n) += src (n).
template <typename F>
void add_inplace(F* dst, const F* src, size_t n);
// dst (n) += src (n) with an fp32 destination: a bf16 micro-batch gradient summed in fp32.
void add_inplace(float* dst, const bf16* src, size_t n);
// The columns [0, cols) of `rows` rows: dst rows ld_dst apart = (copy) or += (add) src rows
// ld_src apart (context parallelism's K/V columns of qkv, packed and unpacked).
template <typename F>
void copy_columns(F* dst, size_t ld_dst, const F* src, size_t ld_src, size_t rows, size_t cols);
template <typename F>
void add_columns(F* dst, size_t ld_dst, const F* src, size_t ld_src, size_t rows, size_t cols);
// x (n) = value (an fp32 buffer: the log-sum-exps' start at -inf).
void fill(float* x, size_t n, float value);

// Cross-entropy over a vocabulary split between tensor-parallel ranks, the same three passes as
// the CPU's (see backend/cpu/ops.hpp), so the tensor-parallel code between them is unchanged:
//   crossentropy_row_max -> max-reduce row_max -> crossentropy_exp_sums -> sum-reduce sums (N,2)
//   -> crossentropy_finish.
// row_max (N), sums (N,2) and losses (N) are device buffers; probs may alias logits throughout.
template <typename F>
void crossentropy_row_max(float* row_max, const F* logits, int N, int Vl, int valid);
template <typename F>
void crossentropy_exp_sums(double* sums, F* probs, const F* logits, const float* row_max,
                           const int32_t* targets, int N, int Vl, int valid, int v0);
template <typename F>
void crossentropy_finish(float* losses, F* probs, const double* sums, int N, int Vl, int valid);
// dlogits (N,Vl) overwritten = dloss * (probs - onehot(target)) on the real columns, 0 on the
// padding. dlogits may alias probs.
template <typename F>
void crossentropy_backward(F* dlogits, const F* probs, const int32_t* targets, float dloss, int N,
                           int Vl, int valid, int v0);

// The optimizer's pieces (twins of backend/cpu/adamw.cpp). AdamW on fp32 master weights;
// `params_copy` (C = bf16 or float), when not nullptr, receives the updated weights in its type
// (the bf16 copy the GEMMs read).
template <typename C>
void adamw_update(float* params, C* params_copy, const float* grads, float* m, float* v, size_t n,
                  bool decay, const AdamWHyper& hyper, double lr, long t);
// *acc (one double in device memory) += the sum of squares of x[0, n) in double: fixed grid,
// fixed order, so the same n gives the same bits. Queued: the step reads the norm's accumulator
// once, after every piece is in.
void sum_of_squares(double* acc, const float* x, size_t n);
void scale(float* x, size_t n, float factor);
// Adafactor (twins of backend/cpu/adafactor.cpp, which says what each does); every sum in a
// fixed order (no atomics), so the same shapes give the same bits. `params_copy` as adamw's.
void adafactor_sums(float* row_sums, float* col_sums, const float* g, size_t n,
                    const MatrixWindow& window);
void adafactor_factors(float* row, float* col, float* row_mean, const float* row_sums,
                       const float* col_sums, size_t rows, size_t cols, const AdafactorHyper& h,
                       long t);
void adafactor_rms(double* acc, const float* g, const SecondMoment& s, size_t n,
                   const AdafactorHyper& h, long t);
template <typename C>
void adafactor_update(float* params, C* params_copy, const float* g, float* m,
                      const SecondMoment& s, size_t n, bool decay, const AdafactorHyper& h,
                      double lr, float inv_clip);

// Memory and synchronisation (memory.cu; backend/backend.hpp says what each is for): device
// memory from cudaMalloc, the loader's ring pinned (cudaHostAlloc); zero and copy queue on
// device::stream(); to_host and to_device return complete; upload copies pinned host memory on the copy
// stream, and await_uploads makes device::stream() wait for those copies (not the host).
Allocator memory();
Allocator loader_memory();
void zero(void* p, size_t bytes);
void copy(void* dst, const void* src, size_t bytes);
void to_host(void* dst, const void* src, size_t bytes);
void to_device(void* dst, const void* src, size_t bytes);
void upload(void* dst, const void* src, size_t bytes);
void await_uploads();
void sync();
// op_events(on): the step breakdown's ops timed by events on the rank's stream (op_events.cu,
// backend/op_clock.hpp), or not.
void op_events(bool on);
void poison(void* p, size_t bytes);
// "device memory (rank 0, bf16):" and the arena's buffers; the datasheet's dense peak of this
// GPU for the precision (0 for a GPU not in the table: the trainer then measures the CPU's).
std::string memory_report(const Arena& arena, bool bf16);
double peak_gflops(bool bf16, bool fp8);

}  // namespace tessera::cuda
