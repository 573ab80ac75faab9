// Integer kernels for AVX-512 with VNNI: vpdpbusd for the int8 products (compiled with
// -mavx512vnni on top of the AVX-512 flags; only called when the CPU reports VNNI).
#include "backends/cpu/quant_vec_avx512.hpp"

namespace troupe::cpu {

const quant_kernels& avx512_vnni_quant_kernels() {
  static const quant_kernels table = make_quant_kernels<avx512_qvec<true>>();
  return table;
}

}  // namespace troupe::cpu
