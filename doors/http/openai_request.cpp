#include "doors/http/openai_request.hpp"

#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "doors/http/guided_fields.hpp"
#include "grammar/guided_grammar.hpp"

namespace troupe {

namespace {

using json = nlohmann::json;

// Thrown inside the parser only; turned into the api_error at its boundary.
struct parameter_error {
  api_error error;
};

[[noreturn]] void fail(const std::string& param, const std::string& problem) {
  throw parameter_error{bad_parameter(param, "'" + param + "': " + problem)};
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "something else";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& v) {
  fail(param, std::string("expected ") + expected + ", got " + type_name(v));
}

std::string read_string(const json& v, const std::string& param, size_t max_bytes) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() > max_bytes) fail(param, "longer than " + std::to_string(max_bytes) + " bytes");
  return s;
}

int64_t read_int(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) wrong_type(param, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    fail(param, "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  const int64_t value = v.get<int64_t>();
  if (value < lo || value > hi) {
    fail(param, std::to_string(value) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return value;
}

bool read_bool(const json& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.get<bool>();
}

std::vector<int32_t> read_token_ids(const json& v, const std::string& param, size_t max_count) {
  if (!v.is_array()) wrong_type(param, "an array of token ids", v);
  if (v.size() > max_count) fail(param, "more than " + std::to_string(max_count) + " token ids");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    ids.push_back(static_cast<int32_t>(
        read_int(v[i], param + "[" + std::to_string(i) + "]", 0, std::numeric_limits<int32_t>::max())));
  }
  return ids;
}

// The fields of the request object, taken one by one; what is left over is unknown.
class request_fields {
 public:
  // `where` prefixes the names of unknown fields ("messages[2]").
  explicit request_fields(const json& body, std::string where = {}) : where_(std::move(where)) {
    for (auto it = body.begin(); it != body.end(); ++it) fields_.emplace(it.key(), &it.value());
  }

  // null counts as "not given", as OpenAI's API takes it.
  const json* take(const std::string& key) {
    auto it = fields_.find(key);
    if (it == fields_.end()) return nullptr;
    const json* value = it->second;
    fields_.erase(it);
    return value->is_null() ? nullptr : value;
  }

  void reject_unknown() const {
    if (!fields_.empty()) {
      const std::string param = where_.empty() ? fields_.begin()->first : where_ + "." + fields_.begin()->first;
      throw parameter_error{bad_parameter(param, "'" + param + "': unrecognized request argument")};
    }
  }

 private:
  std::map<std::string, const json*> fields_;
  std::string where_;
};

std::string read_content(const json& v, const std::string& param, const protocol_limits& limits) {
  if (v.is_string()) return read_string(v, param, limits.max_string_bytes);
  if (!v.is_array()) wrong_type(param, "a string or an array of content parts", v);
  if (v.size() > limits.max_messages) fail(param, "more than " + std::to_string(limits.max_messages) + " parts");
  // Text parts are joined, as the chat templates of text-only models would see them.
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = param + "[" + std::to_string(i) + "]";
    const json& part = v[i];
    if (!part.is_object()) wrong_type(where, "a content part object", part);
    auto type = part.find("type");
    if (type == part.end()) fail(where + ".type", "missing");
    if (!type->is_string() || *type != "text") {
      fail(where + ".type", "only \"text\" content parts are supported, got " + type->dump());
    }
    auto body = part.find("text");
    if (body == part.end()) fail(where + ".text", "missing");
    text += read_string(*body, where + ".text", limits.max_string_bytes);
    if (text.size() > limits.max_string_bytes) fail(param, "longer than " + std::to_string(limits.max_string_bytes) + " bytes");
  }
  return text;
}

std::vector<chat_message> read_messages(const json& v, const protocol_limits& limits) {
  if (!v.is_array()) wrong_type("messages", "an array", v);
  if (v.empty()) fail("messages", "is empty");
  if (v.size() > limits.max_messages) fail("messages", "more than " + std::to_string(limits.max_messages) + " entries");
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  std::vector<chat_message> messages;
  messages.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!v[i].is_object()) wrong_type(where, "an object", v[i]);
    request_fields fields(v[i], where);
    chat_message message;
    const json* role = fields.take("role");
    if (!role) fail(where + ".role", "missing");
    message.role = read_string(*role, where + ".role", 64);
    if (!roles.count(message.role)) {
      fail(where + ".role", "unknown role \"" + message.role + "\" (system, developer, user, assistant or tool)");
    }
    const json* content = fields.take("content");
    if (content) {
      message.content = read_content(*content, where + ".content", limits);
    } else if (message.role != "assistant") {
      fail(where + ".content", "missing");
    }
    (void)fields.take("name");  // speaker names do not reach the templates of these models
    (void)fields.take("tool_call_id");
    fields.reject_unknown();
    messages.push_back(std::move(message));
  }
  return messages;
}

std::vector<openai_prompt> read_prompts(const json& v, const openai_limits& limits) {
  const protocol_limits& p = limits;
  auto text_prompt = [&](const json& s, const std::string& param) {
    openai_prompt prompt;
    prompt.text = read_string(s, param, p.max_string_bytes);
    if (prompt.text.empty()) fail(param, "is empty");
    return prompt;
  };
  auto id_prompt = [&](const json& a, const std::string& param) {
    openai_prompt prompt;
    prompt.kind = prompt_kind::token_ids;
    prompt.token_ids = read_token_ids(a, param, p.max_prompt_token_ids);
    if (prompt.token_ids.empty()) fail(param, "is empty");
    return prompt;
  };
  std::vector<openai_prompt> prompts;
  if (v.is_string()) {
    prompts.push_back(text_prompt(v, "prompt"));
  } else if (v.is_array()) {
    if (v.empty()) fail("prompt", "is empty");
    if (v[0].is_number_integer()) {
      prompts.push_back(id_prompt(v, "prompt"));  // one prompt of token ids
    } else {
      if (v.size() > static_cast<size_t>(limits.max_prompts)) {
        fail("prompt", "more than " + std::to_string(limits.max_prompts) + " prompts");
      }
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string param = "prompt[" + std::to_string(i) + "]";
        if (v[i].is_string()) {
          prompts.push_back(text_prompt(v[i], param));
        } else if (v[i].is_array()) {
          prompts.push_back(id_prompt(v[i], param));
        } else {
          wrong_type(param, "a string or an array of token ids", v[i]);
        }
      }
    }
  } else {
    wrong_type("prompt", "a string, an array of strings or an array of token ids", v);
  }
  return prompts;
}

// `stop`: one string or an array of them. Their number, emptiness and length are value rules
// (validate_sampling_params); only the wire bound on strings applies here.
std::vector<std::string> read_stop(const json& v, const protocol_limits& limits) {
  std::vector<std::string> stop;
  if (v.is_string()) {
    stop.push_back(read_string(v, "stop", limits.max_string_bytes));
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      stop.push_back(read_string(v[i], "stop[" + std::to_string(i) + "]", limits.max_string_bytes));
    }
  } else {
    wrong_type("stop", "a string or an array of strings", v);
  }
  return stop;
}

// An integer field of sampling_params: the JSON only has to carry a value that fits.
int read_int32(const json& v, const std::string& param) {
  if (!v.is_number_integer()) wrong_type(param, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    fail(param, std::to_string(v.get<uint64_t>()) + " does not fit in a 32-bit integer");
  }
  const int64_t value = v.get<int64_t>();
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
    fail(param, std::to_string(value) + " does not fit in a 32-bit integer");
  }
  return static_cast<int>(value);
}

// A float field of sampling_params. A double beyond float's range becomes an infinity (which
// the value rules refuse) instead of an undefined conversion.
float read_float(const json& v, const std::string& param) {
  if (!v.is_number()) wrong_type(param, "a number", v);
  const double value = v.get<double>();
  constexpr float infinity = std::numeric_limits<float>::infinity();
  if (std::fabs(value) > std::numeric_limits<float>::max()) return value > 0 ? infinity : -infinity;
  return static_cast<float>(value);
}

// Reads the sampling fields' JSON; their values are judged by validate_sampling_params, the
// rules the ZeroMQ door applies too. Where the OpenAI API names a field differently
// (max_completion_tokens, top_logprobs), a problem is reported under the name the client used.
void read_sampling(request_fields& fields, openai_request& r, const openai_limits& limits) {
  auto& s = r.sampling;
  const bool chat = r.endpoint == openai_endpoint::chat_completions;
  if (const json* v = fields.take("temperature")) s.temperature = read_float(*v, "temperature");
  if (const json* v = fields.take("top_p")) s.top_p = read_float(*v, "top_p");
  if (const json* v = fields.take("top_k")) s.top_k = read_int32(*v, "top_k");
  if (const json* v = fields.take("min_p")) s.min_p = read_float(*v, "min_p");
  if (const json* v = fields.take("presence_penalty")) s.presence_penalty = read_float(*v, "presence_penalty");
  if (const json* v = fields.take("frequency_penalty")) s.frequency_penalty = read_float(*v, "frequency_penalty");
  if (const json* v = fields.take("repetition_penalty")) s.repetition_penalty = read_float(*v, "repetition_penalty");
  if (const json* v = fields.take("seed")) {
    // Any integer is carried; a negative one (as two's complement) is refused by the value rules.
    if (!v->is_number_integer()) wrong_type("seed", "an integer", *v);
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
  const json* max_tokens = fields.take("max_tokens");
  const json* max_completion_tokens = chat ? fields.take("max_completion_tokens") : nullptr;
  if (max_tokens) s.max_tokens = read_int32(*max_tokens, "max_tokens");
  if (max_completion_tokens) {
    // It wins over max_tokens (OpenAI's newer name); a max_tokens beside it is only type-checked.
    s.max_tokens = read_int32(*max_completion_tokens, "max_completion_tokens");
  } else if (!max_tokens) {
    // OpenAI's defaults: 16 for completions; a chat runs until it stops or the context ends.
    s.max_tokens = chat ? limits.max_model_len : std::min(16, limits.max_model_len);
  }
  if (const json* v = fields.take("stop")) s.stop = read_stop(*v, limits);
  if (const json* v = fields.take("stop_token_ids")) {
    s.stop_token_ids = read_token_ids(*v, "stop_token_ids", limits.max_prompt_token_ids);
  }
  if (const json* v = fields.take("ignore_eos")) s.ignore_eos = read_bool(*v, "ignore_eos");
  if (const json* v = fields.take("num_speculative_tokens")) {
    s.num_speculative_tokens = read_int32(*v, "num_speculative_tokens");
  }
  bool top_logprobs = false;
  if (chat) {
    const json* logprobs = fields.take("logprobs");
    const bool want = logprobs && read_bool(*logprobs, "logprobs");
    if (const json* v = fields.take("top_logprobs")) {
      const int top = read_int32(*v, "top_logprobs");
      // A count of alternatives; "logprobs": false is how a chat turns them off.
      if (top < 0) fail("top_logprobs", std::to_string(top) + " is negative");
      if (!want && top > 0) fail("top_logprobs", "needs \"logprobs\": true");
      if (want) r.logprobs = top;
      top_logprobs = true;
    } else if (want) {
      r.logprobs = 0;
    }
  } else if (const json* v = fields.take("logprobs")) {
    r.logprobs = read_int32(*v, "logprobs");
  }
  s.logprobs = r.logprobs;
  if (auto problem = validate_sampling_params(s, limits)) {
    std::string param = problem->field;
    if (param == "max_tokens" && max_completion_tokens) param = "max_completion_tokens";
    if (param == "logprobs" && top_logprobs) param = "top_logprobs";
    fail(param, problem->problem);
  }
  normalize_sampling_params(s);
  r.logprobs = s.logprobs;
}

// Structured output (guided_fields.hpp), checked where every other value is: a schema or regex
// that cannot be compiled, or a max_tokens below its shortest output, is a 400 naming it.
void read_guided(request_fields& fields, openai_request& r, std::string_view body, const openai_limits& limits) {
  guided_fields asked;
  asked.response_format = fields.take("response_format");
  asked.guided_json = fields.take("guided_json");
  asked.guided_regex = fields.take("guided_regex");
  asked.guided_choice = fields.take("guided_choice");
  std::string param;
  try {
    r.sampling.guided = read_guided_fields(asked, body, limits.max_string_bytes, param);
  } catch (const guided_field_error& e) {
    throw parameter_error{bad_parameter(e.param, e.problem)};
  }
  if (!is_guided(r.sampling)) return;
  auto problem = validate_sampling_params(r.sampling, limits);
  if (!problem) problem = check_guided_decoding(r.sampling);
  if (problem) {
    // max_tokens here stands for max_completion_tokens too (whichever the client sent).
    fail(problem->field == "max_tokens" ? "max_tokens" : param, problem->problem);
  }
}

// Known OpenAI fields this server cannot honour: refused when they ask for something, accepted
// when they ask for the default.
void refuse_unsupported(request_fields& fields, const openai_request& r) {
  if (const json* v = fields.take("echo"); v && read_bool(*v, "echo")) fail("echo", "true is not supported");
  if (const json* v = fields.take("suffix"); v && !read_string(*v, "suffix", 1 << 20).empty()) {
    fail("suffix", "is not supported");
  }
  if (const json* v = fields.take("best_of"); v && read_int(*v, "best_of", 1, 1 << 20) != r.n) {
    fail("best_of", "only best_of = n is supported");
  }
  if (const json* v = fields.take("logit_bias"); v && !(v->is_object() && v->empty())) {
    fail("logit_bias", "is not supported");
  }
  if (const json* v = fields.take("tools"); v && !(v->is_array() && v->empty())) fail("tools", "are not supported");
  if (const json* v = fields.take("tool_choice"); v && *v != "none") fail("tool_choice", "only \"none\" is supported");
  // Accepted and without effect here.
  for (const char* ignored : {"user", "metadata", "store", "service_tier", "parallel_tool_calls"}) {
    (void)fields.take(ignored);
  }
}

}  // namespace

std::variant<openai_request, api_error> parse_openai_request(openai_endpoint endpoint, std::string_view body,
                                                             const openai_limits& limits) {
  json root;
  try {
    // The depth bound keeps a body of a million '[' from costing more than its bytes.
    const int max_depth = limits.max_json_depth;
    json::parser_callback_t within_depth = [max_depth](int depth, json::parse_event_t, json&) {
      if (depth > max_depth) throw parameter_error{bad_parameter("", "the request body nests deeper than " + std::to_string(max_depth) + " levels")};
      return true;
    };
    root = json::parse(body.begin(), body.end(), within_depth);
  } catch (const parameter_error& e) {
    return e.error;
  } catch (const json::exception& e) {
    api_error error;
    error.message = std::string("the request body is not valid JSON: ") + e.what();
    return error;
  }
  try {
    if (!root.is_object()) {
      api_error error;
      error.message = std::string("the request body must be a JSON object, got ") + type_name(root);
      return error;
    }
    openai_request r;
    r.endpoint = endpoint;
    request_fields fields(root);
    const json* model = fields.take("model");
    if (!model) fail("model", "missing");
    r.model = read_string(*model, "model", 1024);
    if (endpoint == openai_endpoint::completions) {
      const json* prompt = fields.take("prompt");
      if (!prompt) fail("prompt", "missing");
      r.prompts = read_prompts(*prompt, limits);
    } else {
      const json* messages = fields.take("messages");
      if (!messages) fail("messages", "missing");
      openai_prompt chat;
      chat.kind = prompt_kind::messages;
      chat.messages = read_messages(*messages, limits);
      r.prompts.push_back(std::move(chat));
    }
    if (const json* v = fields.take("n")) r.n = static_cast<int>(read_int(*v, "n", 1, limits.max_n));
    if (r.num_choices() > limits.max_choices) {
      fail("n", std::to_string(r.prompts.size()) + " prompts x n = " + std::to_string(r.num_choices()) +
                    " choices; at most " + std::to_string(limits.max_choices));
    }
    if (const json* v = fields.take("stream")) r.stream = read_bool(*v, "stream");
    if (const json* v = fields.take("stream_options")) {
      if (!r.stream) fail("stream_options", "only allowed when \"stream\" is true");
      if (!v->is_object()) wrong_type("stream_options", "an object", *v);
      for (auto it = v->begin(); it != v->end(); ++it) {
        if (it.key() == "include_usage") {
          if (!it->is_null()) r.include_usage = read_bool(*it, "stream_options.include_usage");
        } else {
          fail("stream_options." + it.key(), "unrecognized option");
        }
      }
    }
    read_sampling(fields, r, limits);
    read_guided(fields, r, body, limits);
    refuse_unsupported(fields, r);
    fields.reject_unknown();
    return r;
  } catch (const parameter_error& e) {
    return e.error;
  }
}

}  // namespace troupe
