#pragma once
// The machine's measured sgemm rate: the peak MFU is reported against on CPU.

namespace tessera {

// Runs 1024^3 sgemms on all OpenMP threads for about `seconds`; GFLOP/s of the fastest one.
double measure_sgemm_gflops(double seconds);

}  // namespace tessera
