#pragma once
// An importance matrix ("imatrix") as llama.cpp's imatrix tool writes it: for each weight matrix
// (by GGUF tensor name), the mean square of each input column's activation over a calibration
// text. A quantizer weighs each column's error by it: where activations are large, an error in
// the weight moves the output most.
//
// Two file formats exist, and both are read:
//  - GGUF (the tool's default since 2025): general.type "imatrix", per matrix a tensor
//    "<name>.in_sum2" of F32 [columns, matrices] holding sums of squares and "<name>.counts" of F32
//    [1, matrices] holding how many activations each sum has (matrices > 1 for MoE experts);
//  - the legacy .dat: int32 entry count; per entry int32 name length, the name, int32 call count,
//    int32 value count, that many f32 (already means, scaled by the call count); optionally
//    int32 chunk count, int32 length and the dataset's name.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace troupe {

struct importance_matrix {
  // GGUF tensor name -> one mean square activation per column, [matrices × columns].
  std::map<std::string, std::vector<float>> entries;
  std::vector<std::string> datasets;  // what it was computed on, when the file says
  int64_t chunk_count = 0;
  bool legacy_format = false;

  // The entry for `tensor`, nullptr when there is none.
  const std::vector<float>* find(const std::string& tensor) const;
};

// Reads either format (told apart by the GGUF magic). Throws naming the file and, where it
// applies, the entry: unreadable or truncated files, a sum without its counts, a non-F32 tensor,
// negative or non-finite values.
importance_matrix load_importance_matrix(const std::filesystem::path& path);

}  // namespace troupe
