#include "doors/http/generation_session.hpp"

#include <fmt/format.h>

#include "doors/http/server_sent_events.hpp"
#include "doors/request_admission.hpp"

namespace troupe {

namespace {

std::string response_id(const openai_request& r, int64_t first_request_id) {
  return fmt::format("{}-{:x}", r.endpoint == openai_endpoint::chat_completions ? "chatcmpl" : "cmpl",
                     first_request_id);
}

choice_output piece_of(const text_delta& d) {
  choice_output piece;
  piece.text = d.text;
  piece.token_ids = d.delta.token_ids;
  piece.logprobs = d.delta.logprobs;
  // "abort" never reaches a client that is still there; OpenAI knows only stop and length.
  if (d.delta.finished()) piece.finish_reason = d.delta.finish == finish_reason::length ? "length" : "stop";
  return piece;
}

}  // namespace

generation_session::generation_session(openai_request request, int64_t first_request_id, int64_t created,
                                       token_text_fn token_text)
    : request_(std::move(request)),
      first_request_id_(first_request_id),
      builder_(request_, response_id(request_, first_request_id), created, std::move(token_text)),
      outputs_(static_cast<size_t>(request_.num_choices())),
      started_(outputs_.size(), false),
      finished_(outputs_.size(), false),
      prompt_tokens_(outputs_.size(), 0),
      completion_tokens_(outputs_.size(), 0) {}

int64_t generation_session::request_id(int choice) const {
  return request_admission::nth_id(first_request_id_, choice);
}

std::vector<tokenize_request> generation_session::engine_requests() const {
  std::vector<tokenize_request> out;
  for (int choice = 0; choice < num_choices(); ++choice) {
    const auto& prompt = request_.prompts[static_cast<size_t>(choice / request_.n)];
    const int sample = choice % request_.n;
    tokenize_request job;
    job.request_id = request_id(choice);
    job.kind = prompt.kind;
    job.prompt = prompt.text;
    job.prompt_token_ids = prompt.token_ids;
    job.messages = prompt.messages;
    job.sampling = request_.sampling;
    if (job.sampling.seed) job.sampling.seed = *job.sampling.seed + static_cast<uint64_t>(sample);
    out.push_back(std::move(job));
  }
  return out;
}

void generation_session::apply(engine_event event) {
  const auto choice = static_cast<size_t>(event.choice);
  if (choice >= outputs_.size() || finished_[choice]) return;
  if (!started_[choice]) {
    started_[choice] = true;
    ++num_started_;
  }
  if (auto* failed = std::get_if<request_failed>(&event.what)) {
    finished_[choice] = true;
    ++num_finished_;
    if (!failure_) failure_ = from_engine_error(failed->code, failed->message, request_.prompt_param());
    return;
  }
  const auto& d = std::get<text_delta>(event.what);
  if (d.delta.finished()) {
    finished_[choice] = true;
    ++num_finished_;
    if (d.delta.metrics) {
      prompt_tokens_[choice] = d.delta.metrics->num_prompt_tokens;
      completion_tokens_[choice] = d.delta.metrics->num_output_tokens;
      speculative_.add(*d.delta.metrics);
    }
  }
  if (request_.stream) {
    unsent_.push_back(std::move(event));
    return;
  }
  auto& all = outputs_[choice];
  choice_output piece = piece_of(d);
  all.text += piece.text;
  all.token_ids.insert(all.token_ids.end(), piece.token_ids.begin(), piece.token_ids.end());
  all.logprobs.insert(all.logprobs.end(), piece.logprobs.begin(), piece.logprobs.end());
  if (piece.finish_reason) all.finish_reason = piece.finish_reason;
}

std::vector<int64_t> generation_session::unfinished_request_ids() const {
  std::vector<int64_t> ids;
  for (int choice = 0; choice < num_choices(); ++choice) {
    if (!finished_[static_cast<size_t>(choice)]) ids.push_back(request_id(choice));
  }
  return ids;
}

usage_counts generation_session::usage() const {
  usage_counts usage;
  for (int choice = 0; choice < num_choices(); ++choice) {
    // A prompt is read once however many samples are drawn from it.
    if (choice % request_.n == 0) usage.prompt_tokens += prompt_tokens_[static_cast<size_t>(choice)];
    usage.completion_tokens += completion_tokens_[static_cast<size_t>(choice)];
  }
  usage.speculative = speculative_;
  return usage;
}

std::string generation_session::take_stream_text() {
  std::string out;
  if (stream_ended_) return out;
  for (auto& event : unsent_) {
    const auto& d = std::get<text_delta>(event.what);
    choice_output piece = piece_of(d);
    // Deltas with neither text nor an end (a token still inside a UTF-8 sequence, or a stop
    // string being matched) make no chunk unless logprobs want their tokens.
    if (piece.text.empty() && !piece.finish_reason && (request_.logprobs < 0 || piece.token_ids.empty())) continue;
    out += sse::event(dump_json(builder_.chunk(event.choice, piece)));
  }
  unsent_.clear();
  if (failure_) {
    out += sse::event(failure_->to_json());
    out += sse::done;
    stream_ended_ = true;
  } else if (all_finished()) {
    if (request_.include_usage) out += sse::event(dump_json(builder_.usage_chunk(usage())));
    out += sse::done;
    stream_ended_ = true;
  }
  return out;
}

std::string generation_session::full_body() { return dump_json(builder_.full_response(outputs_, usage())); }

}  // namespace troupe
