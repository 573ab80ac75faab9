#pragma once
// Weight matrices of the types with no repacked layout (f32, f16, bf16, and the quantized types
// quant_repack.hpp does not tile: Q2_K, Q3_K, MXFP4, ...) copied out of the model file's mapping
// into one buffer of transparent huge pages at load. Decode streams every weight byte once per token; from a
// file mapping that is a 4 KiB page, and a TLB miss, every 4 KiB, and in a virtual machine each
// miss walks two page tables. On the 1.1 B F16 model one thread's decode went from 2.1-5.6 to
// 5.8-8.7 tokens/s with the copy, measured side by side (docs/benchmarks.md). The repacked
// quantized types already live in such a buffer (quant_repack.hpp); this gives the other types
// the same pages with their bytes unchanged, so results keep their bits.
//
// The file's pages are dropped once a matrix is copied (release_source_pages), so resident
// memory still holds each weight once. A matrix in anonymous memory (a loader's converted or
// un-permuted copy) is copied only when its owner can free the original (the caller says which),
// else it would be resident twice: it stays where it is.

#include <cstddef>
#include <vector>

#include "backends/cpu/quant_repack.hpp"

namespace troupe::cpu {

struct weight_view;
class thread_pool;

// Whether models copy such weights into huge pages at load (default on; benchmarks and tests
// turn it off to measure the difference or to read the mapping itself).
bool weights_in_huge_pages();
void set_weights_in_huge_pages(bool on);

// Whether the kernel hands out transparent huge pages on request: THP mode "always" or
// "madvise" (/sys/kernel/mm/transparent_hugepage/enabled). Without them the copy would cost load
// time and buy nothing.
bool transparent_huge_pages_on_request();

struct huge_page_copy {
  repacked_buffer buffer;              // every copied matrix, 64-byte aligned each; null: none copied
  std::vector<size_t> from_anonymous;  // indices into `weights` of copies whose source was not a file mapping
};

// Copies each matrix of `weights` that is not repacked and whose type has no repacked layout
// (one copy per distinct source, so a tied lm_head and embedding share it) into one huge-page
// buffer on the pool's threads, points the views at it and drops the file pages they came from.
// A source in anonymous memory is copied only where `owner_frees_anonymous[i]` (the caller then
// frees the original: from_anonymous lists them). Does nothing when the switch is off or huge
// pages are not on request.
huge_page_copy copy_weights_to_huge_pages(thread_pool& pool, const std::vector<weight_view*>& weights,
                                          const std::vector<bool>& owner_frees_anonymous);

}  // namespace troupe::cpu
