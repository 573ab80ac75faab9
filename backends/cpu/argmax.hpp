#pragma once
// The index of a row's largest value, as greedy sampling needs it for every sequence of every
// step over the whole vocabulary: the first maximum wins, as in the reference implementations,
// and a NaN is never chosen (a row of NaNs gives 0).

#include <cstdint>
#include <span>

namespace troupe {

int32_t argmax(std::span<const float> values);

}  // namespace troupe
