#include "protocol/codec.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include <msgpack.hpp>

namespace troupe {

const char* error_code_name(error_code code) {
  switch (code) {
    case error_code::bad_request: return "bad_request";
    case error_code::unauthorized: return "unauthorized";
    case error_code::prompt_too_long: return "prompt_too_long";
    case error_code::overloaded: return "overloaded";
    case error_code::slo_unattainable: return "slo_unattainable";
    case error_code::duplicate_id: return "duplicate_id";
    case error_code::not_found: return "not_found";
    case error_code::unavailable: return "unavailable";
    case error_code::internal: return "internal";
  }
  return "internal";
}

namespace {
constexpr error_code all_error_codes[] = {
    error_code::bad_request, error_code::unauthorized,     error_code::prompt_too_long,
    error_code::overloaded,  error_code::slo_unattainable, error_code::duplicate_id,
    error_code::not_found,   error_code::unavailable,      error_code::internal};
}  // namespace

std::optional<error_code> error_code_from_name(const std::string& name) {
  for (auto code : all_error_codes) {
    if (name == error_code_name(code)) return code;
  }
  return std::nullopt;
}

std::optional<error_code> error_code_from_value(int value) {
  for (auto code : all_error_codes) {
    if (static_cast<int>(code) == value) return code;
  }
  return std::nullopt;
}

namespace {

// Thrown inside the decoder only; turned into a protocol_error at its boundary.
struct field_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* type_name(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL: return "nil";
    case msgpack::type::BOOLEAN: return "bool";
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER: return "integer";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return "float";
    case msgpack::type::STR: return "string";
    case msgpack::type::BIN: return "binary";
    case msgpack::type::ARRAY: return "array";
    case msgpack::type::MAP: return "map";
    case msgpack::type::EXT: return "extension";
  }
  return "unknown";
}

[[noreturn]] void fail(const std::string& field, const std::string& problem) {
  throw field_error("field '" + field + "': " + problem);
}

// The fields of one msgpack map by name, remembering which were read so that leftovers can be
// reported as unknown.
class map_fields {
 public:
  map_fields(const msgpack::object& o, const std::string& where, const protocol_limits& limits) {
    if (o.type != msgpack::type::MAP) fail(where, std::string("expected a map, got ") + type_name(o));
    if (o.via.map.size > limits.max_map_entries) fail(where, "too many entries");
    for (uint32_t i = 0; i < o.via.map.size; ++i) {
      const auto& kv = o.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) {
        fail(where, std::string("keys must be strings, got ") + type_name(kv.key));
      }
      std::string key(kv.key.via.str.ptr, kv.key.via.str.size);
      if (!fields_.emplace(key, &kv.val).second) fail(key, "given twice");
    }
    where_ = where;
  }

  const msgpack::object* take(const std::string& key) {
    auto it = fields_.find(key);
    if (it == fields_.end()) return nullptr;
    const msgpack::object* value = it->second;
    fields_.erase(it);
    // nil means "not given", so clients may send explicit defaults.
    return value->type == msgpack::type::NIL ? nullptr : value;
  }

  void reject_unknown() const {
    if (!fields_.empty()) {
      throw field_error("unknown field '" + fields_.begin()->first + "'" +
                        (where_.empty() ? std::string() : " in " + where_));
    }
  }

 private:
  std::map<std::string, const msgpack::object*> fields_;
  std::string where_;
};

std::string read_string(const msgpack::object& o, const std::string& field, size_t max_bytes) {
  if (o.type != msgpack::type::STR) fail(field, std::string("expected a string, got ") + type_name(o));
  if (o.via.str.size > max_bytes) {
    fail(field, "longer than " + std::to_string(max_bytes) + " bytes");
  }
  return std::string(o.via.str.ptr, o.via.str.size);
}

int64_t read_int(const msgpack::object& o, const std::string& field, int64_t lo, int64_t hi) {
  int64_t value = 0;
  if (o.type == msgpack::type::POSITIVE_INTEGER) {
    if (o.via.u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(field, "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    value = static_cast<int64_t>(o.via.u64);
  } else if (o.type == msgpack::type::NEGATIVE_INTEGER) {
    value = o.via.i64;
  } else {
    fail(field, std::string("expected an integer, got ") + type_name(o));
  }
  if (value < lo || value > hi) {
    fail(field, std::to_string(value) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return value;
}

bool read_bool(const msgpack::object& o, const std::string& field) {
  if (o.type != msgpack::type::BOOLEAN) fail(field, std::string("expected a bool, got ") + type_name(o));
  return o.via.boolean;
}

std::vector<int32_t> read_token_ids(const msgpack::object& o, const std::string& field, size_t max_count) {
  if (o.type != msgpack::type::ARRAY) fail(field, std::string("expected an array, got ") + type_name(o));
  if (o.via.array.size > max_count) {
    fail(field, "more than " + std::to_string(max_count) + " entries");
  }
  std::vector<int32_t> ids;
  ids.reserve(o.via.array.size);
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    ids.push_back(static_cast<int32_t>(
        read_int(o.via.array.ptr[i], field + "[" + std::to_string(i) + "]", 0, std::numeric_limits<int32_t>::max())));
  }
  return ids;
}

std::vector<chat_message> read_messages(const msgpack::object& o, const protocol_limits& limits) {
  if (o.type != msgpack::type::ARRAY) fail("messages", std::string("expected an array, got ") + type_name(o));
  if (o.via.array.size == 0) fail("messages", "is empty");
  if (o.via.array.size > limits.max_messages) {
    fail("messages", "more than " + std::to_string(limits.max_messages) + " entries");
  }
  std::vector<chat_message> messages;
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    std::string where = "messages[" + std::to_string(i) + "]";
    map_fields fields(o.via.array.ptr[i], where, limits);
    chat_message message;
    const auto* role = fields.take("role");
    const auto* content = fields.take("content");
    if (!role) fail(where + ".role", "missing");
    if (!content) fail(where + ".content", "missing");
    message.role = read_string(*role, where + ".role", 64);
    if (message.role.empty()) fail(where + ".role", "is empty");
    message.content = read_string(*content, where + ".content", limits.max_string_bytes);
    fields.reject_unknown();
    messages.push_back(std::move(message));
  }
  return messages;
}

// `stop`: one string or an array of them (OpenAI's shape). Their number, emptiness and length
// are value rules (validate_sampling_params); only the wire bound on strings applies here.
std::vector<std::string> read_stop_strings(const msgpack::object& o, const protocol_limits& limits) {
  std::vector<std::string> stop;
  if (o.type == msgpack::type::STR) {
    stop.push_back(read_string(o, "stop", limits.max_string_bytes));
  } else if (o.type == msgpack::type::ARRAY) {
    for (uint32_t i = 0; i < o.via.array.size; ++i) {
      stop.push_back(read_string(o.via.array.ptr[i], "stop[" + std::to_string(i) + "]", limits.max_string_bytes));
    }
  } else {
    fail("stop", std::string("expected a string or an array of strings, got ") + type_name(o));
  }
  return stop;
}

// An integer field of sampling_params: the wire only has to carry a value that fits.
int read_int32(const msgpack::object& o, const std::string& field) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) {
    if (o.via.u64 > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      fail(field, std::to_string(o.via.u64) + " does not fit in a 32-bit integer");
    }
    return static_cast<int>(o.via.u64);
  }
  if (o.type == msgpack::type::NEGATIVE_INTEGER) {
    if (o.via.i64 < std::numeric_limits<int32_t>::min()) {
      fail(field, std::to_string(o.via.i64) + " does not fit in a 32-bit integer");
    }
    return static_cast<int>(o.via.i64);
  }
  fail(field, std::string("expected an integer, got ") + type_name(o));
}

// A float field of sampling_params. A double beyond float's range becomes an infinity (which
// the value rules refuse) instead of an undefined conversion.
float read_float(const msgpack::object& o, const std::string& field) {
  double value = 0.0;
  switch (o.type) {
    case msgpack::type::POSITIVE_INTEGER: value = static_cast<double>(o.via.u64); break;
    case msgpack::type::NEGATIVE_INTEGER: value = static_cast<double>(o.via.i64); break;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: value = o.via.f64; break;
    default: fail(field, std::string("expected a number, got ") + type_name(o));
  }
  constexpr float infinity = std::numeric_limits<float>::infinity();
  if (std::fabs(value) > std::numeric_limits<float>::max()) return value > 0 ? infinity : -infinity;
  return static_cast<float>(value);
}

// `slo: {ttft_ms, tpot_ms}`: latency targets in milliseconds, each zero or positive (0: none).
void read_slo(const msgpack::object& o, service_targets& targets, const protocol_limits& limits) {
  map_fields fields(o, "slo", limits);
  auto target = [&](const char* key, double& out) {
    const auto* v = fields.take(key);
    if (v == nullptr) return;
    const std::string name = std::string("slo.") + key;
    const double ms = read_float(*v, name);
    if (!std::isfinite(ms) || ms < 0)
      fail(name, "must be a number of milliseconds, zero or positive, got " + std::to_string(ms));
    out = ms;
  };
  target("ttft_ms", targets.ttft_ms);
  target("tpot_ms", targets.tpot_ms);
  fields.reject_unknown();
}

// Structured output: at most one of guided_json (the schema's JSON text), guided_json_object
// (true: any JSON object), guided_regex, guided_choice (strings). Whether the constraint compiles
// is the door's check (grammar/guided_grammar.hpp); the wire format is read here.
void read_guided(map_fields& fields, guided_decoding& g, const protocol_limits& limits) {
  int num_asked = 0;
  if (const auto* v = fields.take("guided_json")) {
    g = {guided_kind::json_schema, read_string(*v, "guided_json", limits.max_string_bytes), {}};
    ++num_asked;
  }
  if (const auto* v = fields.take("guided_json_object"); v && read_bool(*v, "guided_json_object")) {
    g = {guided_kind::json_object, "", {}};
    ++num_asked;
  }
  if (const auto* v = fields.take("guided_regex")) {
    g = {guided_kind::regex, read_string(*v, "guided_regex", limits.max_string_bytes), {}};
    ++num_asked;
  }
  if (const auto* v = fields.take("guided_choice")) {
    if (v->type != msgpack::type::ARRAY)
      fail("guided_choice", std::string("expected an array of strings, got ") + type_name(*v));
    g = {guided_kind::choice, "", {}};
    for (uint32_t i = 0; i < v->via.array.size && i <= limits.max_guided_choices; ++i) {
      g.choices.push_back(
          read_string(v->via.array.ptr[i], "guided_choice[" + std::to_string(i) + "]", limits.max_string_bytes));
    }
    ++num_asked;
  }
  if (num_asked > 1) {
    throw field_error("give only one of 'guided_json', 'guided_json_object', 'guided_regex' and 'guided_choice'");
  }
}

// Reads the sampling fields' wire format; their values are judged by validate_sampling_params,
// the rules the HTTP door applies too.
void read_sampling(map_fields& fields, sampling_params& s, const protocol_limits& limits) {
  // The default asks for no more than the context holds.
  s.max_tokens = std::min(s.max_tokens, limits.max_model_len);
  if (const auto* v = fields.take("temperature")) s.temperature = read_float(*v, "temperature");
  if (const auto* v = fields.take("top_k")) s.top_k = read_int32(*v, "top_k");
  if (const auto* v = fields.take("top_p")) s.top_p = read_float(*v, "top_p");
  if (const auto* v = fields.take("min_p")) s.min_p = read_float(*v, "min_p");
  if (const auto* v = fields.take("repetition_penalty")) s.repetition_penalty = read_float(*v, "repetition_penalty");
  if (const auto* v = fields.take("presence_penalty")) s.presence_penalty = read_float(*v, "presence_penalty");
  if (const auto* v = fields.take("frequency_penalty")) s.frequency_penalty = read_float(*v, "frequency_penalty");
  if (const auto* v = fields.take("seed")) {
    // Any integer is carried; a negative one (as two's complement) is refused by the value rules.
    if (v->type == msgpack::type::POSITIVE_INTEGER) {
      s.seed = v->via.u64;
    } else if (v->type == msgpack::type::NEGATIVE_INTEGER) {
      s.seed = static_cast<uint64_t>(v->via.i64);
    } else {
      fail("seed", std::string("expected an integer, got ") + type_name(*v));
    }
  }
  if (const auto* v = fields.take("max_tokens")) s.max_tokens = read_int32(*v, "max_tokens");
  if (const auto* v = fields.take("stop_token_ids")) {
    s.stop_token_ids = read_token_ids(*v, "stop_token_ids", limits.max_prompt_token_ids);
  }
  if (const auto* v = fields.take("stop")) s.stop = read_stop_strings(*v, limits);
  if (const auto* v = fields.take("plugins")) {
    if (v->type != msgpack::type::ARRAY)
      fail("plugins", std::string("expected an array of strings, got ") + type_name(*v));
    // One past the limit is read, so the value rules name the count.
    for (uint32_t i = 0; i < v->via.array.size && i <= limits.max_logits_plugins; ++i) {
      s.logits_plugins.push_back(
          read_string(v->via.array.ptr[i], "plugins[" + std::to_string(i) + "]", limits.max_string_bytes));
    }
  }
  if (const auto* v = fields.take("ignore_eos")) s.ignore_eos = read_bool(*v, "ignore_eos");
  if (const auto* v = fields.take("logprobs")) {
    if (v->type == msgpack::type::BOOLEAN) {
      s.logprobs = v->via.boolean ? 0 : -1;
    } else {
      s.logprobs = read_int32(*v, "logprobs");
    }
  }
  if (const auto* v = fields.take("prompt_logprobs")) {
    // A count; leaving the field out is none (vLLM reads -1 as the whole vocabulary: refused).
    s.prompt_logprobs = read_int32(*v, "prompt_logprobs");
    if (s.prompt_logprobs < 0) {
      fail("prompt_logprobs", std::to_string(s.prompt_logprobs) + " is negative (a count of alternatives in [0, " +
                                  std::to_string(limits.max_logprobs) + "])");
    }
  }
  if (const auto* v = fields.take("num_speculative_tokens")) {
    s.num_speculative_tokens = read_int32(*v, "num_speculative_tokens");
  }
  read_guided(fields, s.guided, limits);
  if (auto problem = validate_sampling_params(s, limits)) fail(problem->field, problem->problem);
  normalize_sampling_params(s);
}

client_request decode_fields(map_fields& fields, const std::string& type, std::string id,
                             const protocol_limits& limits) {
  std::string api_key;
  if (const auto* v = fields.take("api_key")) api_key = read_string(*v, "api_key", 1024);
  if (type == "abort") {
    fields.reject_unknown();
    return abort_request{std::move(id), std::move(api_key)};
  }
  if (type == "stats") {
    fields.reject_unknown();
    return stats_request{std::move(id), std::move(api_key)};
  }
  generate_request request;
  request.id = std::move(id);
  request.api_key = std::move(api_key);
  int num_inputs = 0;
  if (const auto* v = fields.take("prompt")) {
    request.prompt = read_string(*v, "prompt", limits.max_string_bytes);
    if (request.prompt->empty()) fail("prompt", "is empty");
    ++num_inputs;
  }
  if (const auto* v = fields.take("prompt_token_ids")) {
    request.prompt_token_ids = read_token_ids(*v, "prompt_token_ids", limits.max_prompt_token_ids);
    if (request.prompt_token_ids->empty()) fail("prompt_token_ids", "is empty");
    ++num_inputs;
  }
  if (const auto* v = fields.take("messages")) {
    request.messages = read_messages(*v, limits);
    ++num_inputs;
  }
  if (num_inputs != 1) {
    throw field_error(num_inputs == 0 ? "one of 'prompt', 'prompt_token_ids' or 'messages' is required"
                                      : "give only one of 'prompt', 'prompt_token_ids' and 'messages'");
  }
  read_sampling(fields, request.sampling, limits);
  if (const auto* v = fields.take("stream")) request.stream = read_bool(*v, "stream");
  if (const auto* v = fields.take("priority")) request.priority = int(read_int(*v, "priority", -1000000, 1000000));
  if (const auto* v = fields.take("slo")) read_slo(*v, request.targets, limits);
  if (const auto* v = fields.take("tenant"))
    request.targets.tenant = read_string(*v, "tenant", limits.max_string_bytes);
  fields.reject_unknown();
  return request;
}

// -- encoding helpers ---------------------------------------------------------------------------

using packer = msgpack::packer<msgpack::sbuffer>;

void pack_str(packer& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// A logprobs entry's alternatives: [[token_id, logprob], ...], most likely first.
void pack_top(packer& p, const std::vector<std::pair<int32_t, float>>& top) {
  p.pack_array(static_cast<uint32_t>(top.size()));
  for (const auto& [id, value] : top) {
    p.pack_array(2);
    p.pack(id);
    p.pack(value);
  }
}

void pack_ids(packer& p, const std::vector<int32_t>& ids) {
  p.pack_array(static_cast<uint32_t>(ids.size()));
  for (int32_t id : ids) p.pack(id);
}

}  // namespace

std::variant<client_request, protocol_error> decode_request(std::string_view frame, const protocol_limits& limits) {
  if (frame.size() > limits.max_frame_bytes) {
    return protocol_error{{},
                          error_code::bad_request,
                          "frame of " + std::to_string(frame.size()) + " bytes exceeds the limit of " +
                              std::to_string(limits.max_frame_bytes)};
  }
  if (frame.empty()) return protocol_error{{}, error_code::bad_request, "empty frame"};
  msgpack::object_handle handle;
  try {
    size_t offset = 0;
    // The limits stop a small frame from announcing huge containers (msgpack reserves for them).
    msgpack::unpack_limit unpack_limits(limits.max_prompt_token_ids, limits.max_map_entries, limits.max_string_bytes, 0,
                                        0, limits.max_depth);
    handle = msgpack::unpack(frame.data(), frame.size(), offset, nullptr, nullptr, unpack_limits);
    if (offset != frame.size()) {
      return protocol_error{
          {},
          error_code::bad_request,
          "malformed msgpack: " + std::to_string(frame.size() - offset) + " trailing bytes after the request map"};
    }
  } catch (const msgpack::size_overflow& e) {
    return protocol_error{{},
                          error_code::bad_request,
                          std::string("malformed msgpack: a container, string or nesting exceeds "
                                      "the server's limits (") +
                              e.what() + ")"};
  } catch (const std::exception& e) {
    return protocol_error{{}, error_code::bad_request, std::string("malformed msgpack: ") + e.what()};
  }
  std::string id;
  try {
    map_fields fields(handle.get(), "request", limits);
    if (const auto* v = fields.take("id")) {
      id = read_string(*v, "id", limits.max_id_bytes);
    }
    const auto* type_field = fields.take("type");
    if (!type_field) fail("type", "missing (expected \"generate\", \"abort\" or \"stats\")");
    std::string type = read_string(*type_field, "type", 16);
    if (type != "generate" && type != "abort" && type != "stats") {
      fail("type", "unknown request type '" + type + "' (expected generate, abort or stats)");
    }
    if (id.empty() && type != "stats") fail("id", "missing or empty");
    return decode_fields(fields, type, id, limits);
  } catch (const field_error& e) {
    return protocol_error{id, error_code::bad_request, e.what()};
  }
}

std::string encode_request(const client_request& request) {
  msgpack::sbuffer buffer;
  packer p(buffer);
  std::visit(
      [&](const auto& r) {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, generate_request>) {
          const auto& s = r.sampling;
          // num_speculative_tokens only when chosen: a request that leaves it to the server still
          // reaches servers from before the field existed (they refuse unknown fields).
          const bool speculative_chosen = s.num_speculative_tokens != sampling_params{}.num_speculative_tokens;
          uint32_t n = 17 + (s.seed ? 1 : 0) + (r.api_key.empty() ? 0 : 1) + (is_guided(s) ? 1 : 0) +
                       (speculative_chosen ? 1 : 0) + (s.prompt_logprobs >= 0 ? 1 : 0) +
                       (s.logits_plugins.empty() ? 0 : 1);
          // Targets and tenant only when given, for the same reason.
          const bool has_slo = r.targets.ttft_ms > 0 || r.targets.tpot_ms > 0;
          n += (has_slo ? 1 : 0) + (r.targets.tenant.empty() ? 0 : 1);
          p.pack_map(n);
          pack_str(p, "type");
          pack_str(p, "generate");
          pack_str(p, "id");
          pack_str(p, r.id);
          if (r.prompt) {
            pack_str(p, "prompt");
            pack_str(p, *r.prompt);
          } else if (r.prompt_token_ids) {
            pack_str(p, "prompt_token_ids");
            pack_ids(p, *r.prompt_token_ids);
          } else {
            pack_str(p, "messages");
            const auto& messages = r.messages ? *r.messages : std::vector<chat_message>{};
            p.pack_array(static_cast<uint32_t>(messages.size()));
            for (const auto& m : messages) {
              p.pack_map(2);
              pack_str(p, "role");
              pack_str(p, m.role);
              pack_str(p, "content");
              pack_str(p, m.content);
            }
          }
          pack_str(p, "temperature");
          p.pack(s.temperature);
          pack_str(p, "top_k");
          p.pack(s.top_k);
          pack_str(p, "top_p");
          p.pack(s.top_p);
          pack_str(p, "min_p");
          p.pack(s.min_p);
          pack_str(p, "repetition_penalty");
          p.pack(s.repetition_penalty);
          pack_str(p, "presence_penalty");
          p.pack(s.presence_penalty);
          pack_str(p, "frequency_penalty");
          p.pack(s.frequency_penalty);
          pack_str(p, "max_tokens");
          p.pack(s.max_tokens);
          pack_str(p, "stop_token_ids");
          pack_ids(p, s.stop_token_ids);
          pack_str(p, "stop");
          p.pack_array(static_cast<uint32_t>(s.stop.size()));
          for (const auto& text : s.stop) pack_str(p, text);
          pack_str(p, "ignore_eos");
          p.pack(s.ignore_eos);
          pack_str(p, "logprobs");
          p.pack(s.logprobs);
          if (s.prompt_logprobs >= 0) {
            pack_str(p, "prompt_logprobs");
            p.pack(s.prompt_logprobs);
          }
          if (!s.logits_plugins.empty()) {
            pack_str(p, "plugins");
            p.pack_array(static_cast<uint32_t>(s.logits_plugins.size()));
            for (const auto& name : s.logits_plugins) pack_str(p, name);
          }
          pack_str(p, "stream");
          p.pack(r.stream);
          pack_str(p, "priority");
          p.pack(r.priority);
          if (has_slo) {
            pack_str(p, "slo");
            p.pack_map(2);
            pack_str(p, "ttft_ms");
            p.pack(r.targets.ttft_ms);
            pack_str(p, "tpot_ms");
            p.pack(r.targets.tpot_ms);
          }
          if (!r.targets.tenant.empty()) {
            pack_str(p, "tenant");
            pack_str(p, r.targets.tenant);
          }
          if (s.seed) {
            pack_str(p, "seed");
            p.pack(*s.seed);
          }
          if (speculative_chosen) {
            pack_str(p, "num_speculative_tokens");
            p.pack(s.num_speculative_tokens);
          }
          switch (s.guided.kind) {
            case guided_kind::none: break;
            case guided_kind::json_schema:
              pack_str(p, "guided_json");
              pack_str(p, s.guided.source);
              break;
            case guided_kind::json_object:
              pack_str(p, "guided_json_object");
              p.pack(true);
              break;
            case guided_kind::regex:
              pack_str(p, "guided_regex");
              pack_str(p, s.guided.source);
              break;
            case guided_kind::choice:
              pack_str(p, "guided_choice");
              p.pack_array(static_cast<uint32_t>(s.guided.choices.size()));
              for (const auto& choice : s.guided.choices) pack_str(p, choice);
              break;
          }
          if (!r.api_key.empty()) {
            pack_str(p, "api_key");
            pack_str(p, r.api_key);
          }
        } else {
          p.pack_map(r.api_key.empty() ? 2 : 3);
          pack_str(p, "type");
          pack_str(p, std::is_same_v<T, abort_request> ? "abort" : "stats");
          pack_str(p, "id");
          pack_str(p, r.id);
          if (!r.api_key.empty()) {
            pack_str(p, "api_key");
            pack_str(p, r.api_key);
          }
        }
      },
      request);
  return std::string(buffer.data(), buffer.size());
}

std::string encode_reply(const server_reply& reply) {
  msgpack::sbuffer buffer;
  packer p(buffer);
  std::visit(
      [&](const auto& r) {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, delta_reply>) {
          uint32_t n = 4 + (r.logprobs ? 1 : 0) + (r.prompt_logprobs ? 1 : 0) + (r.finish_reason ? 1 : 0) +
                       (r.usage ? 1 : 0) + (r.timings ? 1 : 0);
          p.pack_map(n);
          pack_str(p, "type");
          pack_str(p, "delta");
          pack_str(p, "id");
          pack_str(p, r.id);
          pack_str(p, "text");
          pack_str(p, r.text);
          pack_str(p, "token_ids");
          pack_ids(p, r.token_ids);
          if (r.logprobs) {
            pack_str(p, "logprobs");
            p.pack_array(static_cast<uint32_t>(r.logprobs->size()));
            for (const auto& lp : *r.logprobs) {
              p.pack_map(3);
              pack_str(p, "token_id");
              p.pack(lp.token_id);
              pack_str(p, "logprob");
              p.pack(lp.logprob);
              pack_str(p, "top");
              pack_top(p, lp.top);
            }
          }
          if (r.prompt_logprobs) {
            pack_str(p, "prompt_logprobs");
            p.pack_array(static_cast<uint32_t>(r.prompt_logprobs->size()));
            for (const auto& lp : *r.prompt_logprobs) {
              p.pack_map(4);
              pack_str(p, "token_id");
              p.pack(lp.token_id);
              pack_str(p, "logprob");
              p.pack(lp.logprob);
              pack_str(p, "rank");
              p.pack(lp.rank);
              pack_str(p, "top");
              pack_top(p, lp.top);
            }
          }
          if (r.finish_reason) {
            pack_str(p, "finish_reason");
            pack_str(p, *r.finish_reason);
          }
          if (r.usage) {
            pack_str(p, "usage");
            const auto& speculative = r.usage->speculative;
            p.pack_map(speculative ? 4 : 3);
            pack_str(p, "prompt_tokens");
            p.pack(r.usage->prompt_tokens);
            pack_str(p, "completion_tokens");
            p.pack(r.usage->completion_tokens);
            pack_str(p, "num_preemptions");
            p.pack(r.usage->num_preemptions);
            if (speculative) {
              pack_str(p, "speculative");
              p.pack_map(4);
              pack_str(p, "draft_tokens");
              p.pack(speculative->draft_tokens);
              pack_str(p, "accepted_tokens");
              p.pack(speculative->accepted_tokens);
              pack_str(p, "acceptance_rate");
              p.pack(speculative->acceptance_rate);
              pack_str(p, "tokens_per_step");
              p.pack(speculative->tokens_per_step);
            }
          }
          if (r.timings) {
            pack_str(p, "timings");
            p.pack_map(4);
            pack_str(p, "queue");
            p.pack(r.timings->queue);
            pack_str(p, "ttft");
            p.pack(r.timings->ttft);
            pack_str(p, "tpot");
            p.pack(r.timings->tpot);
            pack_str(p, "e2e");
            p.pack(r.timings->e2e);
          }
        } else if constexpr (std::is_same_v<T, error_reply>) {
          p.pack_map(4);
          pack_str(p, "type");
          pack_str(p, "error");
          pack_str(p, "id");
          pack_str(p, r.id);
          pack_str(p, "code");
          pack_str(p, error_code_name(r.code));
          pack_str(p, "message");
          pack_str(p, r.message);
        } else {
          p.pack_map(9);
          pack_str(p, "type");
          pack_str(p, "stats");
          pack_str(p, "id");
          pack_str(p, r.id);
          pack_str(p, "num_free_blocks");
          p.pack(r.num_free_blocks);
          pack_str(p, "num_total_blocks");
          p.pack(r.num_total_blocks);
          pack_str(p, "num_running");
          p.pack(r.num_running);
          pack_str(p, "num_waiting");
          p.pack(r.num_waiting);
          pack_str(p, "num_requests_in_flight");
          p.pack(r.num_requests_in_flight);
          pack_str(p, "num_waiting_for_kv");
          p.pack(r.num_waiting_for_kv);
          pack_str(p, "num_kv_leases");
          p.pack(r.num_kv_leases);
        }
      },
      reply);
  return std::string(buffer.data(), buffer.size());
}

namespace {

std::string as_string(const msgpack::object& o) { return o.as<std::string>(); }

const msgpack::object* find(const msgpack::object& map, std::string_view key) {
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const auto& kv = map.via.map.ptr[i];
    if (kv.key.type == msgpack::type::STR && std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) == key) {
      return &kv.val;
    }
  }
  return nullptr;
}

const msgpack::object& need(const msgpack::object& map, std::string_view key) {
  const auto* value = find(map, key);
  if (!value) throw std::runtime_error("server reply lacks field '" + std::string(key) + "'");
  return *value;
}

}  // namespace

server_reply decode_reply(std::string_view frame) {
  msgpack::object_handle handle;
  try {
    handle = msgpack::unpack(frame.data(), frame.size());
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("server reply is not msgpack: ") + e.what());
  }
  const auto& o = handle.get();
  if (o.type != msgpack::type::MAP) throw std::runtime_error("server reply is not a map");
  try {
    std::string type = as_string(need(o, "type"));
    if (type == "delta") {
      delta_reply r;
      r.id = as_string(need(o, "id"));
      r.text = as_string(need(o, "text"));
      r.token_ids = need(o, "token_ids").as<std::vector<int32_t>>();
      if (const auto* v = find(o, "logprobs")) {
        r.logprobs.emplace();
        for (uint32_t i = 0; i < v->via.array.size; ++i) {
          const auto& e = v->via.array.ptr[i];
          token_logprob lp;
          lp.token_id = need(e, "token_id").as<int32_t>();
          lp.logprob = need(e, "logprob").as<float>();
          lp.top = need(e, "top").as<std::vector<std::pair<int32_t, float>>>();
          r.logprobs->push_back(std::move(lp));
        }
      }
      if (const auto* v = find(o, "prompt_logprobs")) {
        r.prompt_logprobs.emplace();
        for (uint32_t i = 0; i < v->via.array.size; ++i) {
          const auto& e = v->via.array.ptr[i];
          prompt_logprob lp;
          lp.token_id = need(e, "token_id").as<int32_t>();
          lp.logprob = need(e, "logprob").as<float>();
          lp.rank = need(e, "rank").as<int32_t>();
          lp.top = need(e, "top").as<std::vector<std::pair<int32_t, float>>>();
          r.prompt_logprobs->push_back(std::move(lp));
        }
      }
      if (const auto* v = find(o, "finish_reason")) r.finish_reason = as_string(*v);
      if (const auto* v = find(o, "usage")) {
        r.usage = usage_info{need(*v, "prompt_tokens").as<int>(), need(*v, "completion_tokens").as<int>()};
        // Servers before num_preemptions existed do not send it.
        if (const auto* n = find(*v, "num_preemptions")) r.usage->num_preemptions = n->as<int>();
        // Only when the engine verified drafts for the request.
        if (const auto* s = find(*v, "speculative")) {
          if (s->type != msgpack::type::MAP) throw std::runtime_error("server reply's usage.speculative is not a map");
          r.usage->speculative =
              speculative_usage{need(*s, "draft_tokens").as<int>(), need(*s, "accepted_tokens").as<int>(),
                                need(*s, "acceptance_rate").as<double>(), need(*s, "tokens_per_step").as<double>()};
        }
      }
      if (const auto* v = find(o, "timings")) {
        r.timings = timing_info{need(*v, "queue").as<double>(), need(*v, "ttft").as<double>(),
                                need(*v, "tpot").as<double>(), need(*v, "e2e").as<double>()};
      }
      return r;
    }
    if (type == "error") {
      error_reply r;
      r.id = as_string(need(o, "id"));
      std::string code = as_string(need(o, "code"));
      r.code = error_code_from_name(code).value_or(error_code::internal);
      r.message = as_string(need(o, "message"));
      return r;
    }
    if (type == "stats") {
      stats_reply r;
      r.id = as_string(need(o, "id"));
      r.num_free_blocks = need(o, "num_free_blocks").as<int>();
      r.num_total_blocks = need(o, "num_total_blocks").as<int>();
      r.num_running = need(o, "num_running").as<int>();
      r.num_waiting = need(o, "num_waiting").as<int>();
      r.num_requests_in_flight = need(o, "num_requests_in_flight").as<int>();
      // Newer fields: a server from before disaggregation does not send them.
      if (const auto* v = find(o, "num_waiting_for_kv")) r.num_waiting_for_kv = v->as<int>();
      if (const auto* v = find(o, "num_kv_leases")) r.num_kv_leases = v->as<int>();
      return r;
    }
    throw std::runtime_error("server reply has unknown type '" + type + "'");
  } catch (const msgpack::type_error&) {
    throw std::runtime_error("server reply has a field of the wrong type");
  }
}

}  // namespace troupe
