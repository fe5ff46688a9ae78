#pragma once
// The machine's measured sgemm rate: the peak MFU is reported against on CPU.

namespace tessera {

// Runs 1024^3 sgemms on all OpenMP threads for about `seconds`; GFLOP/s of the fastest one.
double measure_sgemm_gflops(double seconds);
// Copies a 64 MB buffer on all OpenMP threads for about `seconds`; bytes read plus written per
// second of the fastest copy (the bandwidth memory-bound ops see).
double measure_copy_bandwidth(double seconds);

}  // namespace tessera
