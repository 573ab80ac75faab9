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

choice_output piece_of(const text_delta& d, bool want_prompt_logprobs) {
  choice_output piece;
  // The engine attaches them to the request's first token (whose piece is the first with tokens:
  // later pieces are marked too, and whoever words them keeps the first).
  if (want_prompt_logprobs && !d.delta.token_ids.empty()) {
    piece.prompt_logprobs = d.delta.prompt_logprobs;
    piece.has_prompt_logprobs = true;
  }
  piece.text = d.text;
  piece.token_ids = d.delta.token_ids;
  piece.logprobs = d.delta.logprobs;
  piece.embedding = d.delta.embedding;
  // "abort" never reaches a client that is still there; OpenAI knows only stop and length.
  if (d.delta.finished()) piece.finish_reason = d.delta.finish == finish_reason::length ? "length" : "stop";
  return piece;
}

}  // namespace

generation_session::generation_session(openai_request request, int64_t first_request_id, int64_t created,
                                       token_text_fn token_text, std::optional<output_parsing> parsing,
                                       token_special_fn is_special)
    : generation_session(
          request, first_request_id,
          std::make_unique<openai_response_builder>(request, response_id(request, first_request_id), created,
                                                    std::move(token_text), parsing ? &*parsing : nullptr,
                                                    static_cast<uint64_t>(first_request_id), std::move(is_special)),
          parsing) {}

generation_session::generation_session(openai_request request, int64_t first_request_id,
                                       std::unique_ptr<response_writer> writer, std::optional<output_parsing> parsing)
    : request_(std::move(request)),
      first_request_id_(first_request_id),
      writer_(std::move(writer)),
      outputs_(static_cast<size_t>(request_.num_choices())),
      called_(outputs_.size(), false),
      started_(outputs_.size(), false),
      finished_(outputs_.size(), false),
      prompt_tokens_(outputs_.size(), 0),
      completion_tokens_(outputs_.size(), 0) {
  if (parsing) {
    for (size_t i = 0; i < outputs_.size(); ++i) parsers_.emplace_back(*parsing);
  }
  if (request_.echo) {
    // echo: each choice's text begins with its prompt's (text prompts; ids have no text here).
    for (int choice = 0; choice < num_choices(); ++choice) {
      const auto& prompt = request_.prompts[static_cast<size_t>(choice / request_.n)];
      echo_.push_back(prompt.kind == prompt_kind::text ? prompt.text : std::string());
      writer_->text_before(choice, echo_.back());
    }
  }
}

void generation_session::read_back(int choice, choice_output& piece, bool finished) {
  const auto c = static_cast<size_t>(choice);
  if (!parsers_.empty()) {
    parsed_output parsed = parsers_[c].push(piece.text);
    if (finished) parsed.append(parsers_[c].finish());
    piece.text = std::move(parsed.content);
    piece.reasoning = std::move(parsed.reasoning);
    piece.tool_calls = std::move(parsed.tool_calls);
    if (!piece.tool_calls.empty()) called_[c] = true;
  }
  if (finished && called_[c] && piece.finish_reason == "stop") piece.finish_reason = "tool_calls";
}

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
    job.sampling = request_.sampling;
    job.priority = request_.priority;
    job.targets = request_.targets;
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
  choice_output piece = piece_of(d, request_.sampling.prompt_logprobs >= 0);
  if (piece.has_prompt_logprobs && !all.has_prompt_logprobs) {
    all.prompt_logprobs = std::move(piece.prompt_logprobs);
    all.has_prompt_logprobs = true;
  }
  all.text += piece.text;
  all.token_ids.insert(all.token_ids.end(), piece.token_ids.begin(), piece.token_ids.end());
  all.logprobs.insert(all.logprobs.end(), piece.logprobs.begin(), piece.logprobs.end());
  if (!piece.embedding.empty()) all.embedding = std::move(piece.embedding);
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
    choice_output piece = piece_of(d, request_.sampling.prompt_logprobs >= 0);
    if (!echo_.empty() && !echo_[static_cast<size_t>(event.choice)].empty()) {
      piece.text = std::exchange(echo_[static_cast<size_t>(event.choice)], std::string()) + piece.text;
    }
    read_back(event.choice, piece, d.delta.finished());
    // Deltas with nothing to show and no end (a token still inside a UTF-8 sequence, a stop
    // string or a tool call being matched) make no chunk unless logprobs want their tokens.
    if (piece.text.empty() && piece.reasoning.empty() && piece.tool_calls.empty() && !piece.finish_reason &&
        ((request_.logprobs < 0 && !piece.has_prompt_logprobs) || piece.token_ids.empty())) {
      continue;
    }
    out += writer_->events(event.choice, piece);
  }
  unsent_.clear();
  if (failure_) {
    out += writer_->failure(*failure_);
    stream_ended_ = true;
  } else if (all_finished()) {
    out += writer_->end(usage());
    stream_ended_ = true;
  }
  return out;
}

std::string generation_session::full_body() {
  for (int choice = 0; choice < num_choices(); ++choice) {
    auto& all = outputs_[static_cast<size_t>(choice)];
    if (!echo_.empty()) all.text = echo_[static_cast<size_t>(choice)] + all.text;
    read_back(choice, all, /*finished=*/true);
  }
  return writer_->body(outputs_, usage());
}

}  // namespace troupe
