// Integer kernels for AVX-512 F/BW/VL/DQ without VNNI: maddubs + madd for the int8 products
// (compiled with those flags; only called when the CPU reports them).
#include "backends/cpu/quant_vec_avx512.hpp"

namespace troupe::cpu {

const quant_kernels& avx512_quant_kernels() {
  static const quant_kernels table = make_quant_kernels<avx512_qvec<false>>();
  return table;
}

}  // namespace troupe::cpu
