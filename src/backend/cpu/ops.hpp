#pragma once
// The CPU op set: fp32 for training, fp64 for the finite-difference tests. Plain functions on flat
// row-major buffers, llm.c style; a CUDA op of the same name mirrors each one.
//
// "accumulates" means the function ADDS into its output, because gradients sum over micro-batches
// and the caller zeroes them once per step; every other output is overwritten.
// Every loop is either race-free OpenMP with static schedules or a BLAS call, so a result is
// bit-for-bit the same for a given thread count (checkpoint restart is tested to the bit).
#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/adafactor.hpp"
#include "backend/adamw.hpp"
#include "backend/arena.hpp"
#include "backend/attention_block.hpp"
#include "backend/moe_routing.hpp"
#include "common/fp8_format.hpp"

namespace tessera::cpu {

// C (M,N) = alpha * op(A) · op(B) + beta * C, row-major with leading dimensions; op(A) is (M,K),
// op(B) is (K,N). cblas_sgemm / cblas_dgemm. beta == 0 ignores what C held (NaN included).
template <typename F>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, F alpha, const F* A, int lda, const F* B,
          int ldb, F beta, F* C, int ldc);

// out (B,T,C) = wte[tokens[b,t] - v0, :] + wpe[pos(b,t), :]; tokens (B,T); wte (vcount,C) holds
// rows [v0, v0 + vcount) of the vocabulary, other tokens contribute 0 (vocab-parallel); wpe
// (rows,C) or nullptr (then nothing is added). pos(b,t) = positions[b*T + t] (data.document_mask:
// the token's place in its document), or t when positions is nullptr.
template <typename F>
void encoder_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T, int C,
                     int v0, int vcount, const int32_t* positions = nullptr);
// Accumulates dwte (vcount,C) for tokens in [v0, v0 + vcount) and dwpe (rows,C) unless nullptr,
// from dout (B,T,C), with the forward's positions.
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T, int C,
                      int v0, int vcount, const int32_t* positions = nullptr);
// out, inp (N,C); weight, bias (C); mean, rstd (N) saved for backward. eps = 1e-5 as torch.
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias, int N,
                       int C);
// Accumulates dinp (N,C), dweight (C), dbias (C).
template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                        const F* mean, const F* rstd, int N, int C);
// RMSNorm as LLaMA's (torch: x * rsqrt(mean(x²) + eps) * weight): out, inp (N,C); weight (C);
// rstd (N) = 1/sqrt(mean(x²) + eps) saved for backward.
template <typename F>
void rmsnorm_forward(F* out, F* rstd, const F* inp, const F* weight, int N, int C, double eps);
// Accumulates dinp (N,C), dweight (C).
template <typename F>
void rmsnorm_backward(F* dinp, F* dweight, const F* dout, const F* inp, const F* weight,
                      const F* rstd, int N, int C);

// Per-head RMSNorm of q and k (model.qk_norm, Qwen3's q_norm and k_norm), in place on the q and k
// heads of qkv (N rows of (NH + 2*NKV)*hs, the attention's layout; the v heads untouched): each
// head x (hs) becomes x * rstd * w, rstd = 1/sqrt(mean(x²) + eps), w = weight[0, hs) for the NH
// q heads and weight[hs, 2 hs) for the NKV k heads. raw (N, (NH + NKV)*hs) receives the heads as
// they were, rstd (N, NH + NKV) each head's: the backward's inputs.
template <typename F>
void qk_norm_forward(F* qkv, F* raw, F* rstd, const F* weight, int N, int NH, int NKV, int hs,
                     double eps);
// Its backward in place on dqkv's q and k heads, d(normalised) on entry and d(raw) on exit (not an
// accumulation, as rope_backward; the v heads untouched); accumulates dweight (2 hs).
template <typename F>
void qk_norm_backward(F* dqkv, F* dweight, const F* raw, const F* weight, const F* rstd, int N,
                      int NH, int NKV, int hs);

// out (N,OC) = inp (N,IC) · weightᵀ + bias; weight (OC,IC) as torch nn.Linear; bias (OC) or nullptr.
template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int N, int IC, int OC);
// out (N,OC) += bias (OC), for row-parallel layers whose partial products are summed first.
template <typename F>
void bias_add(F* out, const F* bias, int N, int OC);
// Accumulates dinp (N,IC) += dout·weight, dweight (OC,IC) += doutᵀ·inp, dbias (OC) += colsum(dout).
// dinp and dbias may be nullptr (skipped).
template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                     int N, int IC, int OC);
// A mixture of experts' `held` linear layers, each on its block of rows: expert e's rows start at
// offsets[e], counts[e] of them (host arrays); its weight (OC,IC) at weight + e OC IC, its bias
// (or nullptr) at bias + e OC, its gradients likewise. matmul_forward/backward per expert.
template <typename F>
void experts_forward(F* out, const F* inp, const F* weight, const F* bias, const int* counts,
                     const int* offsets, int held, int IC, int OC);
template <typename F>
void experts_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                      const int* counts, const int* offsets, int held, int IC, int OC);

// The qkv activation (B,T,(NH + 2*NKV)*hs) of grouped-query attention: q heads in columns
// [0, NH*hs), k heads in [NH*hs, (NH+NKV)*hs), v heads in [(NH+NKV)*hs, (NH+2*NKV)*hs), head h of
// a part in its columns [h*hs, (h+1)*hs). Query head h reads kv head h / (NH/NKV) (NKV divides
// NH; NKV = NH, hs = C/NH is GPT-2's multi-head attention, qkv (B,T,3C)).
// att (B,NH,T,T) = causal softmax(q·kᵀ/sqrt(hs)), exactly 0 above the diagonal.
// out (B,T,NH*hs) = att·v, query head h in cols [h*hs,(h+1)*hs). Overwrites out and att.
// doc_start (B,T) or nullptr (data.document_mask): the first position of each query's document,
// whose keys are the only ones it sees (s <= j <= i); att is 0 on the others, so the backward
// needs no mask.
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int NH, int NKV, int hs,
                       const int32_t* doc_start = nullptr);
// Accumulates dqkv (B,T,(NH+2*NKV)*hs) from dout (B,T,NH*hs): a kv head's dk and dv sum over its
// query heads in their order; datt (B,NH,T,T) is scratch, overwritten.
template <typename F>
void attention_backward(F* dqkv, F* datt, const F* dout, const F* qkv, const F* att, int B, int T,
                        int NH, int NKV, int hs);
// The same attention without the (B,NH,T,T) matrix (model.attention: fused): the forward saves
// lse (B,NH,T), each query row's log Σ_{j<=i} exp(q_i·k_j/sqrt(hs)), and overwrites out and lse;
// the backward recomputes the probabilities from q, k and lse and accumulates dqkv from dout,
// using out (B,T,NH*hs) of the forward.
// doc_start as attention_forward's, in both.
template <typename F>
void attention_fused_forward(F* out, F* lse, const F* qkv, int B, int T, int NH, int NKV, int hs,
                             const int32_t* doc_start = nullptr);
template <typename F>
void attention_fused_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse,
                              int B, int T, int NH, int NKV, int hs, const int32_t* doc_start = nullptr);

// Context parallelism (model/context_attention.hpp): one block of causal attention, its shape
// in backend/attention_block.hpp.
// Merges the block into out and lse by log-sum-exp (start them at 0 and -inf).
template <typename F>
void attention_block_forward(F* out, F* lse, const F* q, const F* kv, const AttentionBlock& s);
// delta (B,NH,T) = Σ_c dout ∘ out per query head, rows of stride ldo (the backward's D).
template <typename F>
void attention_delta(F* delta, const F* dout, const F* out, int B, int T, int NH, int hs, int ldo);
// Accumulates dq and the block's dk, dv (in dkv, kv's layout) from dout, with the final lse and
// delta: P = exp(s - lse), dS = P ∘ (dout·vᵀ - delta).
template <typename F>
void attention_block_backward(F* dq, F* dkv, const F* dout, const F* delta, const F* q,
                              const F* kv, const F* lse, const AttentionBlock& s);

// Rotary position embeddings, the HF LLaMA convention (rotate_half): the table cs (T, hs/2, 2)
// holds cs[t][i] = (cos, sin)(t * theta^(-2i/hs)), computed in double and stored as float, on the
// host (hs even).
void rope_table(float* cs, int T, int hs, double theta);
// Rotates the q and k heads of qkv (B,T,(NH+2*NKV)*hs, the attention's layout) in place, row
// b*T + t by position t: for i < hs/2, with (c, s) = cs[t][i],
//   y[i] = x[i] c - x[i + hs/2] s,   y[i + hs/2] = x[i + hs/2] c + x[i] s.
// The v heads are untouched.
template <typename F>
void rope_forward(F* qkv, const float* cs, int B, int T, int NH, int NKV, int hs);
// The backward of that rotation, in place on dqkv's q and k heads: the transposed rotation
// (sin -> -sin). Not an accumulation: dqkv holds d(rotated) on entry and d(unrotated) on exit;
// its v heads are untouched.
template <typename F>
void rope_backward(F* dqkv, const float* cs, int B, int T, int NH, int NKV, int hs);

// Mixture of experts (moe.cpp; the rule in backend/moe_routing.hpp). logits, scores (N,E);
// expert, gates (N,k).
// moe_route_forward: scores overwritten by softmax or sigmoid of the logits, expert by each
// row's top-k choice (by scores + bias (E, or nullptr); ties to the lower index, in the order
// chosen), gates by the chosen scores (renormalised when the rule says).
// moe_route_backward: dlogits (N,E) overwritten from dgates (N,k), plus the auxiliary loss's
// dL/dp[t,e] = aux[e] (E, or nullptr) and the z-loss of coefficient z_coef (0: none), N the
// tokens the z-loss averages over.
// moe_router_stats: stats (E+1) = Σ_t p[t,e] for each e, then Σ_t logsumexp(l[t])², in token
// order (the losses' sums; the auxiliary loss's counts are the caller's).
template <typename F>
void moe_route_forward(int32_t* expert, F* gates, F* scores, const F* logits, const float* bias,
                       int N, const MoeRouting& r);
template <typename F>
void moe_route_backward(F* dlogits, const F* dgates, const F* logits, const F* scores,
                        const int32_t* expert, const F* aux, double z_coef, int N,
                        const MoeRouting& r);
template <typename F>
void moe_router_stats(double* stats, const F* logits, const F* scores, int N,
                      const MoeRouting& r);
// Rows between token order and expert order. moe_gather_rows: out (n,C) row i = in's row
// rows[i]. moe_combine: out (N,C) row t = (accumulate ? out : 0) + Σ_j gates[t,j] · rows'
// row slot_of[t,j] (gates nullptr: 1; a slot of -1, a choice the capacity dropped, adds
// nothing): the experts' outputs back into token order, or (gates nullptr, accumulate) the
// gather's backward. moe_combine_backward: drows' row slot_of[t,j] overwritten = gates[t,j] ·
// dout's row t, dgates[t,j] overwritten = dout's row t · rows' row slot_of[t,j] (0 where
// dropped).
template <typename F>
void moe_gather_rows(F* out, const F* in, const int32_t* rows, int n, int C);
template <typename F>
void moe_combine(F* out, const F* rows, const int32_t* slot_of, const F* gates, int N, int k,
                 int C, bool accumulate);
template <typename F>
void moe_combine_backward(F* drows, F* dgates, const F* dout, const F* rows,
                          const int32_t* slot_of, const F* gates, int N, int k, int C);

// out, inp (n): GELU, tanh form as torch GELU(approximate='tanh').
template <typename F>
void gelu_forward(F* out, const F* inp, size_t n);
// Accumulates dinp (n).
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n);
// SwiGLU: inp (N,2H) holds the gate in columns [0,H) and the up projection in [H,2H);
// out (N,H) = silu(gate) * up, silu(g) = g / (1 + exp(-g)). Overwrites out.
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
// The columns [0, cols) of `rows` rows: dst rows ld_dst apart = (copy) or += (add) src rows
// ld_src apart (context parallelism's K/V columns of qkv, packed and unpacked).
template <typename F>
void copy_columns(F* dst, size_t ld_dst, const F* src, size_t ld_src, size_t rows, size_t cols);
template <typename F>
void add_columns(F* dst, size_t ld_dst, const F* src, size_t ld_src, size_t rows, size_t cols);
// x (n) = value (an fp32 buffer: the log-sum-exps' start at -inf).
void fill(float* x, size_t n, float value);

// Cross-entropy over a vocabulary split between tensor-parallel ranks (one rank: the whole).
// logits, probs (N,Vl) hold vocabulary ids [v0, v0 + Vl), of which the first `valid` columns are
// real (the rest is padding); targets (N). The forward is
//   crossentropy_row_max -> max-reduce row_max over ranks -> crossentropy_exp_sums ->
//   sum-reduce sums (N,2) over ranks -> crossentropy_finish
// and gives probs = softmax over the real vocabulary (padding 0), losses (N) = -log probs[target].
// probs may alias logits throughout.
template <typename F>
void crossentropy_row_max(F* row_max, const F* logits, int N, int Vl, int valid);
template <typename F>
void crossentropy_exp_sums(double* sums, F* probs, const F* logits, const F* row_max,
                           const int32_t* targets, int N, int Vl, int valid, int v0);
template <typename F>
void crossentropy_finish(F* losses, F* probs, const double* sums, int N, int Vl, int valid);
// dlogits (N,Vl) overwritten = dloss * (probs - onehot(target)) on the real columns, 0 on the
// padding; dloss is the same for every row (e.g. 1/(B*T)). dlogits may alias probs.
template <typename F>
void crossentropy_backward(F* dlogits, const F* probs, const int32_t* targets, F dloss, int N,
                           int Vl, int valid, int v0);

// The optimizer's pieces (adamw.cpp). One AdamW update (torch.optim.AdamW: decoupled weight
// decay, bias-corrected moments) of n elements of one tensor; `t` is the 1-based Adam step,
// `decay` whether weight decay applies. `params_copy`, when not nullptr, receives the updated
// weights (the copy the model reads where it is not the master itself; the CPU's never is).
void adamw_update(float* params, float* params_copy, const float* grads, float* m, float* v,
                  size_t n, bool decay, const AdamWHyper& hyper, double lr, long t);
// *acc (one double) += the sum of squares of x[0, n), summed in double in an order that depends
// on n alone (not the thread count), so a run restarted with another OMP_NUM_THREADS still agrees
// to the bit.
void sum_of_squares(double* acc, const float* x, size_t n);
// Adafactor (adafactor.cpp; backend/adafactor.hpp gives the rule), a step in four ops:
// adafactor_sums: row_sums[w.row0 + r] and col_sums[w.col0 + c] += Σ g² over the n elements of a
//   piece of a matrix (its canonical rows and columns, MatrixWindow).
// adafactor_factors: a matrix's statistics row (rows) and col (cols) updated from the sums of
//   its whole canonical tensor; *row_mean = mean(row).
// adafactor_rms: *acc += Σ U² over a piece, U = G / sqrt(estimate) before clipping; for a
//   vector's piece first v = β2_t v + (1 - β2_t)(G² + eps).
// adafactor_update: U · inv_clip, through the first moment m (nullptr: none), then weight decay
//   (`decay`) and the step at learning rate lr; params_copy as adamw_update's.
void adafactor_sums(float* row_sums, float* col_sums, const float* g, size_t n,
                    const MatrixWindow& window);
void adafactor_factors(float* row, float* col, float* row_mean, const float* row_sums,
                       const float* col_sums, size_t rows, size_t cols, const AdafactorHyper& h,
                       long t);
void adafactor_rms(double* acc, const float* g, const SecondMoment& s, size_t n,
                   const AdafactorHyper& h, long t);
void adafactor_update(float* params, float* params_copy, const float* g, float* m,
                      const SecondMoment& s, size_t n, bool decay, const AdafactorHyper& h,
                      double lr, float inv_clip);

// FP8 simulated (backend/cpu/fp8.cpp; common/fp8_format.hpp is the format), the same operations as the
// GPU's (backend/cuda/ops.hpp) on the same one-byte codes.
// fp8_amax: max |x| over n, NaN if any is.
// fp8_cast: the codes of in (rows, cols) * scale, rounded to nearest even and saturating, into
// out (rows, cols) and out_t (cols, rows), either may be nullptr; *amax = max(*amax, max |in|)
// (NaN sticks), *scale_inv = 1 / scale.
// fp8_place: codes already cast (in, rows x cols) copied to out and transposed into out_t, and
// *scale_inv = scale_inv: fp8_cast's two outputs from codes that ZeRO-3 gathered
// (optim/sharded_weights.hpp).
// fp8_gemm: d (M,N) = x.scale_inv y.scale_inv · X (M,K) · Y (N,K)ᵀ [+ d where accumulate]
// [+ bias (N) per row]: cuBLASLt's FP8 GEMM, the codes' values multiplied exactly in fp32 and
// summed, the two factors applied to the sum.
// bias_backward: dbias (OC) += colsum(dout (N,OC)), the bias gradient a GEMM on a quantized
// output gradient leaves to the unquantized one.
float fp8_amax(const float* x, size_t n);
void fp8_cast(uint8_t* out, uint8_t* out_t, const float* in, int rows, int cols, float scale,
              Fp8Format format, float* amax, float* scale_inv);
void fp8_place(uint8_t* out, uint8_t* out_t, const uint8_t* in, int rows, int cols, float scale_inv,
               float* scale_inv_slot);
void fp8_gemm(float* d, const Fp8Operand& x, const Fp8Operand& y, int M, int N, int K,
              const float* bias, bool accumulate);
// The GPU's line of where its FP8 GEMMs ran; the CPU has one way: "".
inline std::string fp8_report() { return ""; }
void bias_backward(float* dbias, const float* dout, int N, int OC);
void scale(float* x, size_t n, float factor);

// Memory and synchronisation (memory.cpp; backend/backend.hpp says what each is for). The CPU's
// buffers are host memory, zeroed when allocated; every copy is a memcpy, nothing is queued.
Allocator memory();
Allocator loader_memory();
void zero(void* p, size_t bytes);
void copy(void* dst, const void* src, size_t bytes);
void to_host(void* dst, const void* src, size_t bytes);
void to_device(void* dst, const void* src, size_t bytes);
void upload(void* dst, const void* src, size_t bytes);
void await_uploads();
void sync();
// The step breakdown's ops are synchronous here: host clocks time them, no events (the CUDA
// backend's op_events).
inline void op_events(bool) {}
void poison(void* p, size_t bytes);
// "" (the trainer's own memory line says it all) and 0 (MFU is measured against sgemm).
std::string memory_report(const Arena& arena, bool bf16);
double peak_gflops(bool bf16, bool fp8);

}  // namespace tessera::cpu
