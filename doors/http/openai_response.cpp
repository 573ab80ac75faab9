#include "doors/http/openai_response.hpp"

namespace troupe {

using json = nlohmann::json;

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

std::string dump_json(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

openai_response_builder::openai_response_builder(const openai_request& request, std::string id, int64_t created,
                                                 token_text_fn token_text)
    : endpoint_(request.endpoint),
      model_(request.model),
      id_(std::move(id)),
      created_(created),
      logprobs_(request.logprobs),
      include_usage_(request.include_usage),
      token_text_(std::move(token_text)),
      role_sent_(static_cast<size_t>(request.num_choices()), false),
      num_text_bytes_(static_cast<size_t>(request.num_choices()), 0) {}

json openai_response_builder::envelope(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

namespace {

json byte_list(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

json openai_response_builder::choice_logprobs(int index, const choice_output& piece) {
  if (logprobs_ < 0) return nullptr;
  const size_t num = std::min(piece.token_ids.size(), piece.logprobs.size());
  if (endpoint_ == openai_endpoint::chat_completions) {
    json content = json::array();
    for (size_t i = 0; i < num; ++i) {
      const auto& lp = piece.logprobs[i];
      const std::string token = token_text_(piece.token_ids[i]);
      json top = json::array();
      for (size_t k = 0; k < lp.top_token_ids.size() && k < lp.top_logprobs.size() &&
                         static_cast<int>(k) < logprobs_;
           ++k) {
        const std::string text = token_text_(lp.top_token_ids[k]);
        top.push_back({{"token", text}, {"logprob", lp.top_logprobs[k]}, {"bytes", byte_list(text)}});
      }
      content.push_back({{"token", token}, {"logprob", lp.logprob}, {"bytes", byte_list(token)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  size_t& offset = num_text_bytes_[static_cast<size_t>(index)];
  for (size_t i = 0; i < num; ++i) {
    const auto& lp = piece.logprobs[i];
    const std::string token = token_text_(piece.token_ids[i]);
    tokens.push_back(token);
    token_logprobs.push_back(lp.logprob);
    if (logprobs_ > 0) {
      json top = json::object();
      for (size_t k = 0; k < lp.top_token_ids.size() && k < lp.top_logprobs.size() &&
                         static_cast<int>(k) < logprobs_;
           ++k) {
        const std::string text = token_text_(lp.top_token_ids[k]);
        if (!top.contains(text)) top[text] = lp.top_logprobs[k];
      }
      top_logprobs.push_back(top);
    } else {
      top_logprobs.push_back(nullptr);
    }
    text_offset.push_back(offset);
    offset += token.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
          {"text_offset", text_offset}};
}

json openai_response_builder::full_response(const std::vector<choice_output>& choices, const usage_counts& usage) {
  const bool chat = endpoint_ == openai_endpoint::chat_completions;
  json out = envelope(chat ? "chat.completion" : "text_completion");
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const auto& c = choices[i];
    json choice = {{"index", i}, {"logprobs", choice_logprobs(static_cast<int>(i), c)},
                   {"finish_reason", c.finish_reason ? json(*c.finish_reason) : json(nullptr)}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
    } else {
      choice["text"] = c.text;
    }
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return out;
}

json openai_response_builder::chunk(int index, const choice_output& piece) {
  const bool chat = endpoint_ == openai_endpoint::chat_completions;
  json out = envelope(chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", index}, {"logprobs", choice_logprobs(index, piece)},
                 {"finish_reason", piece.finish_reason ? json(*piece.finish_reason) : json(nullptr)}};
  if (chat) {
    json delta = json::object();
    if (!role_sent_[static_cast<size_t>(index)]) {
      delta["role"] = "assistant";
      role_sent_[static_cast<size_t>(index)] = true;
    }
    if (!piece.text.empty() || !piece.finish_reason) delta["content"] = piece.text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = piece.text;
  }
  out["choices"] = json::array({std::move(choice)});
  if (include_usage_) out["usage"] = nullptr;
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
