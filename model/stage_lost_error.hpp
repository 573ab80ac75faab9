#pragma once
// A forward that failed because a part of the model running elsewhere (a pipeline stage,
// pipeline/pipelined_model.hpp) is unreachable, or came back without the KV it held. Not the
// fault of the step's requests: the engine puts them back to be recomputed from their tokens
// once the stage is back (stages/scheduler_stage.hpp), where any other failed step ends them.
// A type, not a phrase in the message, so that the decision never depends on wording.

#include <stdexcept>

namespace troupe {

struct stage_lost_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace troupe
