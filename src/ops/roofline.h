// This machine's limits, measured: what the CPU kernels' figures are shares of.
#pragma once

namespace flashmap {
class ThreadPool;
namespace ops {

// Read bandwidth in GB/s with every thread of `pool` summing a 1 GiB buffer.
double read_bandwidth_gbps(ThreadPool& pool);
// The fp32 multiply-add peak in GFLOP/s on every thread of `pool`, on the widest vectors the
// active kernel (ops::active_isa()) uses.
double fma_peak_gflops(ThreadPool& pool);
// The bf16 compute mode's peak (AVX512-BF16 dot products, or AMX tile products where the active
// kernel is Amx; a multiply-add counting 2 flops) in GFLOP/s on every thread of `pool`; 0 where
// the mode cannot run.
double bf16_dot_peak_gflops(ThreadPool& pool);
// The int8 dot-product peak of the active kernel's q8/q4 tiles (vpdpbusd with AVX512-VNNI or
// AVX-VNNI, vpmaddubsw + vpmaddwd on AVX2; a multiply-add counting 2 operations) in GOP/s on
// every thread of `pool`; 0 where those tiles widen to fp32 instead (AVX-512 without VNNI, the
// scalar kernel).
double int8_dot_peak_gops(ThreadPool& pool);

}  // namespace ops
}  // namespace flashmap
