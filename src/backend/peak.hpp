#pragma once
// The machine's measured rates: the sgemm peak MFU is reported against on CPU, and what
// `tessera plan` measures of this machine to predict a CPU step (plan/step_time.cpp).

namespace tessera {

// Runs 1024^3 sgemms on all OpenMP threads for about `seconds`; GFLOP/s of the fastest one.
double measure_sgemm_gflops(double seconds);
// Copies a 64 MB buffer on all OpenMP threads for about `seconds`; bytes read plus written per
// second of the fastest copy (the bandwidth memory-bound ops see).
double measure_copy_bandwidth(double seconds);
// Seconds of one sgemm C(M,N) = op(A)(M,K) op(B)(K,N) as backend/cpu/gemm.cpp calls it, on all
// OpenMP threads; or, per_thread, of one single-threaded copy while every thread runs its own
// (the attention runs one (batch, head) pair per thread). The fastest of a few repetitions,
// cached by shape. A dimension above 1024 is measured at 1024 and the time scaled by the ratio:
// past it BLAS runs at its large-shape rate, and the LM head's full product would take seconds.
double measure_sgemm_seconds(bool trans_a, bool trans_b, int M, int N, int K, bool per_thread);
// expf evaluations per second on all OpenMP threads, in a loop like the CPU ops' (GELU's
// sigmoid, softmax, cross-entropy): on a CPU these ops are bound by it more than by memory.
double measure_exp_rate(double seconds);

// Seconds per element of the optimizer's passes over a rank's buffer (optim/distributed.cpp,
// engine/engine.cpp), timed as the step runs them: on this rank's OpenMP threads while `sharing`
// ranks of the node run the same passes over their own buffers, beyond the caches. AdamW's
// square root and division and the norm's double sum make them slower than a copy.
struct OptimizerRates {
  double adamw = 0;  // adamw_update: parameter, gradient and both moments
  double norm = 0;   // sum_of_squares of the gradients (the global norm)
  double scale = 0;  // scale (gradient clipping)
  double zero = 0;   // zero (the gradients, each step)
};
OptimizerRates measure_optimizer_rates(int sharing);

}  // namespace tessera
