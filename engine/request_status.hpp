#pragma once
// Where a request stands, and why it ended.

#include <string_view>

namespace troupe {

enum class sequence_status {
  waiting,           // queued, holds no blocks
  running,           // holds blocks, scheduled every step it fits the budget
  waiting_for_kv,    // decode side of a disaggregated pair: its KV is still arriving; skipped
  preempted,         // lost its blocks to make room; back in the queue, recomputed when readmitted
  finished_stopped,  // sampled EOS or a stop token
  finished_length,   // reached max_tokens or max_model_len
  finished_aborted,  // aborted by the client
};

enum class finish_reason { none, stop, length, abort };

inline bool is_finished(sequence_status status) {
  return status == sequence_status::finished_stopped || status == sequence_status::finished_length ||
         status == sequence_status::finished_aborted;
}

inline std::string_view sequence_status_name(sequence_status status) {
  switch (status) {
    case sequence_status::waiting: return "waiting";
    case sequence_status::running: return "running";
    case sequence_status::waiting_for_kv: return "waiting_for_kv";
    case sequence_status::preempted: return "preempted";
    case sequence_status::finished_stopped: return "finished_stopped";
    case sequence_status::finished_length: return "finished_length";
    case sequence_status::finished_aborted: return "finished_aborted";
  }
  return "unknown";
}

inline finish_reason finish_reason_of(sequence_status status) {
  switch (status) {
    case sequence_status::finished_stopped: return finish_reason::stop;
    case sequence_status::finished_length: return finish_reason::length;
    case sequence_status::finished_aborted: return finish_reason::abort;
    default: return finish_reason::none;
  }
}

inline std::string_view finish_reason_name(finish_reason reason) {
  switch (reason) {
    case finish_reason::none: return "none";
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::abort: return "abort";
  }
  return "unknown";
}

}  // namespace troupe
