#include "doors/http/openai_response.hpp"

#include "doors/http/chat_plan.hpp"
#include "doors/http/server_sent_events.hpp"

namespace troupe {

using json = nlohmann::json;

namespace {
size_t num_characters(const std::string& bytes);
}  // namespace

json usage_json(const usage_counts& usage) {
  json out = {{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
  if (auto s = usage.speculative.usage()) {
    out["speculative"] = {{"draft_tokens", s->draft_tokens},
                          {"accepted_tokens", s->accepted_tokens},
                          {"acceptance_rate", s->acceptance_rate},
                          {"tokens_per_step", s->tokens_per_step}};
  }
  return out;
}

std::string dump_json(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

openai_response_builder::openai_response_builder(const openai_request& request, std::string id, int64_t created,
                                                 token_text_fn token_text, const output_parsing* parsing,
                                                 uint64_t id_seed, token_special_fn is_special)
    : endpoint_(request.endpoint),
      model_(request.model),
      id_(std::move(id)),
      created_(created),
      logprobs_(request.logprobs),
      prompt_logprobs_(request.sampling.prompt_logprobs),
      prompt_logprobs_sent_(static_cast<size_t>(request.num_choices()), false),
      include_usage_(request.include_usage),
      chat_(request.endpoint == openai_endpoint::chat_completions),
      token_text_(std::move(token_text)),
      is_special_(std::move(is_special)),
      skip_special_tokens_(request.sampling.skip_special_tokens),
      role_sent_(static_cast<size_t>(request.num_choices()), false),
      num_text_chars_(static_cast<size_t>(request.num_choices()), 0),
      num_tool_calls_(static_cast<size_t>(request.num_choices()), 0),
      reasoning_field_(parsing && parsing->parse_reasoning),
      id_syntax_(parsing ? parsing->format.tools : tool_call_syntax::none),
      id_seed_(id_seed) {}

std::string openai_response_builder::body(const std::vector<choice_output>& choices, const usage_counts& usage) {
  return dump_json(full_response(choices, usage));
}

std::string openai_response_builder::events(int index, const choice_output& piece) {
  std::string out;
  for (const auto& chunk : chunks(index, piece)) out += sse::event(dump_json(chunk));
  return out;
}

std::string openai_response_builder::end(const usage_counts& usage) {
  std::string out;
  if (include_usage_) out += sse::event(dump_json(usage_chunk(usage)));
  return out + std::string(sse::done);
}

std::string openai_response_builder::failure(const api_error& error) {
  return sse::event(error.to_json()) + std::string(sse::done);
}

void openai_response_builder::text_before(int index, const std::string& text) {
  num_text_chars_[static_cast<size_t>(index)] += num_characters(text);
}

json openai_response_builder::envelope(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

namespace {

json byte_list(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

size_t num_characters(const std::string& bytes) {
  size_t n = 0;
  for (unsigned char c : bytes) n += is_continuation(c) ? 0 : 1;
  return n;
}

bool whole_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if (!is_continuation(static_cast<unsigned char>(s[i + k]))) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace

std::string logprob_token_text(const std::string& bytes) {
  if (whole_utf8(bytes)) return bytes;
  static const char hex[] = "0123456789abcdef";
  std::string text = "bytes:";
  for (unsigned char c : bytes) {
    text += "\\x";
    text += hex[c >> 4];
    text += hex[c & 15];
  }
  return text;
}

std::string openai_response_builder::output_bytes(int32_t token_id) const {
  if (skip_special_tokens_ && is_special_ && is_special_(token_id)) return {};
  return token_text_(token_id);
}

json openai_response_builder::choice_logprobs(int index, const choice_output& piece) {
  if (logprobs_ < 0) return nullptr;
  const size_t num = std::min(piece.token_ids.size(), piece.logprobs.size());
  if (endpoint_ == openai_endpoint::chat_completions) {
    json content = json::array();
    for (size_t i = 0; i < num; ++i) {
      const auto& lp = piece.logprobs[i];
      const std::string bytes = output_bytes(piece.token_ids[i]);
      json top = json::array();
      for (size_t k = 0; k < lp.top_token_ids.size() && k < lp.top_logprobs.size() && static_cast<int>(k) < logprobs_;
           ++k) {
        const std::string other = token_text_(lp.top_token_ids[k]);
        top.push_back(
            {{"token", logprob_token_text(other)}, {"logprob", lp.top_logprobs[k]}, {"bytes", byte_list(other)}});
      }
      content.push_back({{"token", logprob_token_text(bytes)},
                         {"logprob", lp.logprob},
                         {"bytes", byte_list(bytes)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  // text_offset counts characters (code points, as Python's str and vLLM do); a token that begins
  // inside a character (a byte-fallback piece) points at that character.
  size_t& offset = num_text_chars_[static_cast<size_t>(index)];
  for (size_t i = 0; i < num; ++i) {
    const auto& lp = piece.logprobs[i];
    const std::string bytes = output_bytes(piece.token_ids[i]);
    tokens.push_back(logprob_token_text(bytes));
    token_logprobs.push_back(lp.logprob);
    if (logprobs_ > 0) {
      json top = json::object();
      for (size_t k = 0; k < lp.top_token_ids.size() && k < lp.top_logprobs.size() && static_cast<int>(k) < logprobs_;
           ++k) {
        const std::string text = logprob_token_text(token_text_(lp.top_token_ids[k]));
        if (!top.contains(text)) top[text] = lp.top_logprobs[k];
      }
      top_logprobs.push_back(top);
    } else {
      top_logprobs.push_back(nullptr);
    }
    const bool inside = !bytes.empty() && is_continuation(static_cast<unsigned char>(bytes[0]));
    text_offset.push_back(offset - (inside && offset > 0 ? 1 : 0));
    offset += num_characters(bytes);
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", text_offset}};
}

json openai_response_builder::prompt_logprobs_json(const choice_output& piece) const {
  if (prompt_logprobs_ < 0 || !piece.has_prompt_logprobs) return nullptr;
  json out = json::array({nullptr});
  for (const prompt_token_logprob& lp : piece.prompt_logprobs) {
    json position = json::object();
    auto add = [&](int32_t token, float logprob, int32_t rank) {
      const std::string key = std::to_string(token);
      if (position.contains(key)) return;
      position[key] = {{"logprob", logprob}, {"rank", rank}, {"decoded_token", logprob_token_text(token_text_(token))}};
    };
    add(lp.token_id, lp.logprob, lp.rank);
    for (size_t k = 0;
         k < lp.top_token_ids.size() && k < lp.top_logprobs.size() && static_cast<int>(k) < prompt_logprobs_; ++k) {
      add(lp.top_token_ids[k], lp.top_logprobs[k], static_cast<int32_t>(k) + 1);
    }
    out.push_back(std::move(position));
  }
  return out;
}

json openai_response_builder::full_response(const std::vector<choice_output>& choices, const usage_counts& usage) {
  const bool chat = endpoint_ == openai_endpoint::chat_completions;
  json out = envelope(chat ? "chat.completion" : "text_completion");
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const auto& c = choices[i];
    json choice = {{"index", i},
                   {"logprobs", choice_logprobs(static_cast<int>(i), c)},
                   {"finish_reason", c.finish_reason ? json(*c.finish_reason) : json(nullptr)}};
    if (chat) {
      json message = {{"role", "assistant"},
                      {"content", c.text.empty() && !c.tool_calls.empty() ? json(nullptr) : json(c.text)},
                      {"refusal", nullptr}};
      if (reasoning_field_) message["reasoning_content"] = c.reasoning.empty() ? json(nullptr) : json(c.reasoning);
      if (!c.tool_calls.empty()) message["tool_calls"] = tool_calls_json(static_cast<int>(i), c.tool_calls, false);
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.text;
      if (prompt_logprobs_ >= 0) choice["prompt_logprobs"] = prompt_logprobs_json(c);
    }
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  // A chat's prompt is one for all its choices: vLLM gives its logprobs once, beside them.
  if (chat && prompt_logprobs_ >= 0)
    out["prompt_logprobs"] = choices.empty() ? json(nullptr) : prompt_logprobs_json(choices[0]);
  out["usage"] = usage_json(usage);
  return out;
}

json openai_response_builder::tool_calls_json(int index, const std::vector<parsed_tool_call>& calls, bool streamed) {
  json list = json::array();
  int& sent = num_tool_calls_[static_cast<size_t>(index)];
  for (const auto& call : calls) {
    json item = {{"id", tool_call_id(id_syntax_, id_seed_ + static_cast<uint64_t>(index), sent)},
                 {"type", "function"},
                 {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
    if (streamed) item["index"] = sent;
    ++sent;
    list.push_back(std::move(item));
  }
  return list;
}

std::vector<json> openai_response_builder::chunks(int index, const choice_output& piece) {
  const bool chat = endpoint_ == openai_endpoint::chat_completions;
  // The prompt's logprobs go once per choice, on the first chunk that has its first token.
  json prompt_logprobs = nullptr;
  if (piece.has_prompt_logprobs && !prompt_logprobs_sent_[static_cast<size_t>(index)]) {
    prompt_logprobs = prompt_logprobs_json(piece);
    prompt_logprobs_sent_[static_cast<size_t>(index)] = true;
  }
  auto make = [&](json delta_or_text, bool first, bool last) {
    json out = envelope(chat ? "chat.completion.chunk" : "text_completion");
    json choice = {{"index", index},
                   {"logprobs", first ? choice_logprobs(index, piece) : json(nullptr)},
                   {"finish_reason", last && piece.finish_reason ? json(*piece.finish_reason) : json(nullptr)}};
    if (first && !prompt_logprobs.is_null()) (chat ? out : choice)["prompt_logprobs"] = std::move(prompt_logprobs);
    choice[chat ? "delta" : "text"] = std::move(delta_or_text);
    out["choices"] = json::array({std::move(choice)});
    if (include_usage_) out["usage"] = nullptr;
    return out;
  };
  if (!chat) return {make(piece.text, true, true)};
  // The deltas, each part in its own: reasoning, then content, then the calls.
  std::vector<json> deltas;
  if (!piece.reasoning.empty()) deltas.push_back({{"reasoning_content", piece.reasoning}});
  if (!piece.text.empty()) deltas.push_back({{"content", piece.text}});
  if (!piece.tool_calls.empty()) deltas.push_back({{"tool_calls", tool_calls_json(index, piece.tool_calls, true)}});
  if (deltas.empty()) deltas.push_back(piece.finish_reason ? json::object() : json{{"content", ""}});
  if (!role_sent_[static_cast<size_t>(index)]) {
    deltas.front()["role"] = "assistant";
    role_sent_[static_cast<size_t>(index)] = true;
  }
  std::vector<json> out;
  for (size_t i = 0; i < deltas.size(); ++i) out.push_back(make(std::move(deltas[i]), i == 0, i + 1 == deltas.size()));
  return out;
}

json openai_response_builder::usage_chunk(const usage_counts& usage) const {
  const bool chat = endpoint_ == openai_endpoint::chat_completions;
  json out = envelope(chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

}  // namespace troupe
