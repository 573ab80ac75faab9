#include "text/chat_output_parser.hpp"

#include <nlohmann/json.hpp>

namespace troupe {

namespace {

using ordered_json = nlohmann::ordered_json;
constexpr std::string_view blanks = " \t\r\n";

// The longest suffix of `text` that is a proper prefix of `marker`: what must wait for more text.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

std::string_view trim(std::string_view s) {
  const size_t first = s.find_first_not_of(blanks);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(blanks) - first + 1);
}

std::string compact(const ordered_json& v) { return v.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

ordered_json parse_json(std::string_view text) {
  return ordered_json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

std::optional<parsed_tool_call> call_from_value(const ordered_json& v) {
  if (!v.is_object()) return std::nullopt;
  auto name = v.find("name");
  if (name == v.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  auto args = v.find("arguments");
  if (args == v.end()) args = v.find("parameters");
  parsed_tool_call call;
  call.name = name->get<std::string>();
  if (args == v.end()) {
    call.arguments = "{}";
  } else if (args->is_object()) {
    call.arguments = compact(*args);
  } else if (args->is_string()) {
    // Arguments written as JSON text inside a string, as OpenAI's own API carries them.
    const ordered_json inner = parse_json(args->get_ref<const std::string&>());
    if (!inner.is_object()) return std::nullopt;
    call.arguments = compact(inner);
  } else {
    return std::nullopt;
  }
  return call;
}

// JSON objects one after another, separated by blanks or ';' (Llama 3 writes parallel calls so);
// nothing when anything else stands between them.
std::optional<std::vector<std::string_view>> split_json_objects(std::string_view text) {
  std::vector<std::string_view> objects;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (blanks.find(c) != std::string_view::npos || c == ';') {
      ++i;
      continue;
    }
    if (c != '{') return std::nullopt;
    const size_t start = i;
    int depth = 0;
    bool in_string = false;
    for (; i < text.size(); ++i) {
      const char d = text[i];
      if (in_string) {
        if (d == '\\') {
          ++i;
        } else if (d == '"') {
          in_string = false;
        }
      } else if (d == '"') {
        in_string = true;
      } else if (d == '{' || d == '[') {
        ++depth;
      } else if (d == '}' || d == ']') {
        if (--depth == 0) break;
      }
    }
    if (i >= text.size()) return std::nullopt;  // unbalanced: cut off
    objects.push_back(text.substr(start, ++i - start));
  }
  return objects;
}

// Every call of a list of JSON calls (an array, one object, or objects in a row); nothing unless
// every one parses.
std::optional<std::vector<parsed_tool_call>> calls_from_json_text(std::string_view text) {
  text = trim(text);
  std::vector<parsed_tool_call> calls;
  const ordered_json whole = parse_json(text);
  if (whole.is_array()) {
    if (whole.empty()) return std::nullopt;
    for (const auto& item : whole) {
      auto call = call_from_value(item);
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
    }
    return calls;
  }
  if (whole.is_object()) {
    auto call = call_from_value(whole);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    return calls;
  }
  auto objects = split_json_objects(text);
  if (!objects || objects->empty()) return std::nullopt;
  for (std::string_view object : *objects) {
    auto call = call_from_value(parse_json(object));
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
  }
  return calls;
}

// <think>...</think> split off the front of the output. Blanks opening a section are dropped.
class think_splitter {
 public:
  explicit think_splitter(bool inside) : state_(inside ? state::inside : state::before) {}

  // Adds the reasoning to `reasoning` and returns the text after it.
  std::string push(std::string_view text, std::string& reasoning) {
    held_ += text;
    std::string answer;
    for (;;) {
      if (state_ == state::before) {
        const size_t start = held_.find_first_not_of(blanks);
        if (start == std::string::npos) return answer;
        const std::string_view rest = std::string_view(held_).substr(start);
        if (rest.starts_with(open)) {
          held_.erase(0, start + open.size());
          state_ = state::inside;
          trim_ = true;
          continue;
        }
        if (open.starts_with(rest)) return answer;
        state_ = state::after;  // no reasoning: the whole output is the answer, blanks included
        trim_ = false;
        continue;
      }
      if (trim_) {
        const size_t start = held_.find_first_not_of(blanks);
        if (start == std::string::npos) {
          held_.clear();
          return answer;
        }
        held_.erase(0, start);
        trim_ = false;
      }
      if (state_ == state::inside) {
        const size_t end = held_.find(close);
        if (end != std::string::npos) {
          reasoning += held_.substr(0, end);
          held_.erase(0, end + close.size());
          state_ = state::after;
          trim_ = true;
          continue;
        }
        const size_t keep = partial_marker(held_, close);
        reasoning += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return answer;
      }
      answer += held_;
      held_.clear();
      return answer;
    }
  }

  std::string finish(std::string& reasoning) {
    std::string rest = std::move(held_);
    held_.clear();
    if (trim_ && state_ != state::before) rest.erase(0, std::min(rest.size(), rest.find_first_not_of(blanks)));
    if (state_ == state::inside) {
      reasoning += rest;  // cut off while thinking: all of it was reasoning
      return {};
    }
    return rest;
  }

 private:
  static constexpr std::string_view open = "<think>";
  static constexpr std::string_view close = "</think>";
  enum class state { before, inside, after };
  state state_;
  std::string held_;
  bool trim_ = true;
};

// Tool calls in the answer's text (llama3_json, hermes, mistral). Blanks next to calls are
// dropped: the content is what the model said besides its calls.
class tool_call_extractor {
 public:
  explicit tool_call_extractor(tool_call_syntax syntax) : syntax_(syntax) {}

  void push(std::string_view text, parsed_output& out) {
    held_ += text;
    for (;;) {
      if (in_calls_) {
        if (syntax_ != tool_call_syntax::hermes) return;  // the calls run to the end of the output
        const size_t end = held_.find("</tool_call>");
        if (end == std::string::npos) return;
        close_hermes_call(held_.substr(0, end), "</tool_call>", out);
        held_.erase(0, end + std::string_view("</tool_call>").size());
        in_calls_ = false;
        continue;
      }
      if (syntax_ == tool_call_syntax::llama3_json && at_start_) {
        // A reply that is a call begins with it: {"name": ...}.
        const size_t start = held_.find_first_not_of(blanks);
        if (start == std::string::npos) return;
        if (held_[start] == '{') {
          held_.erase(0, start);
          begin_calls("");
          continue;
        }
        at_start_ = false;
      }
      const std::string_view marker = marker_of(syntax_);
      const size_t begin = held_.find(marker);
      if (begin != std::string::npos) {
        say(std::string_view(held_).substr(0, begin), out);
        held_.erase(0, begin + marker.size());
        begin_calls(marker);
        continue;
      }
      const size_t keep = partial_marker(held_, marker);
      say(std::string_view(held_).substr(0, held_.size() - keep), out);
      held_.erase(0, held_.size() - keep);
      return;
    }
  }

  void finish(parsed_output& out) {
    if (in_calls_) {
      if (syntax_ == tool_call_syntax::hermes) {
        close_hermes_call(held_, "", out);  // the model ended before its closing tag
      } else {
        auto calls = calls_in_tail(held_);
        if (calls) {
          called_ = true;
          for (auto& call : *calls) out.tool_calls.push_back(std::move(call));
        } else {
          say(opening_ + held_, out);
        }
      }
    } else {
      say(held_, out);
    }
    held_.clear();
    if (!called_) out.content += blank_;
    blank_.clear();
  }

 private:
  static std::string_view marker_of(tool_call_syntax syntax) {
    switch (syntax) {
      case tool_call_syntax::hermes: return "<tool_call>";
      case tool_call_syntax::mistral: return "[TOOL_CALLS]";
      default: return "<|python_tag|>";
    }
  }

  void begin_calls(std::string_view marker) {
    in_calls_ = true;
    at_start_ = false;
    blank_.clear();
    opening_ = marker;
  }

  // Content, with trailing blanks held until more text shows they are not just before a call.
  void say(std::string_view text, parsed_output& out) {
    const size_t last = text.find_last_not_of(blanks);
    if (last == std::string_view::npos) {
      blank_ += text;
      return;
    }
    out.content += blank_;
    out.content += text.substr(0, last + 1);
    blank_ = std::string(text.substr(last + 1));
  }

  void close_hermes_call(std::string_view body, std::string_view closing, parsed_output& out) {
    auto call = tool_call_from_json(trim(body));
    if (call) {
      called_ = true;
      out.tool_calls.push_back(std::move(*call));
    } else {
      say(std::string("<tool_call>") + std::string(body) + std::string(closing), out);
    }
  }

  // What follows [TOOL_CALLS] or <|python_tag|> (or the opening '{' of a Llama reply).
  std::optional<std::vector<parsed_tool_call>> calls_in_tail(std::string_view text) const {
    if (syntax_ != tool_call_syntax::mistral) return calls_from_json_text(text);
    // [TOOL_CALLS][{...}, ...] (v3), or [TOOL_CALLS]name[ARGS]{...} repeated (v11).
    std::vector<parsed_tool_call> calls;
    size_t from = 0;
    for (;;) {
      const size_t next = text.find("[TOOL_CALLS]", from);
      const std::string_view part = trim(text.substr(from, next == std::string_view::npos ? next : next - from));
      if (const size_t args = part.find("[ARGS]"); args != std::string_view::npos) {
        parsed_tool_call call;
        call.name = std::string(trim(part.substr(0, args)));
        const ordered_json value = parse_json(part.substr(args + 6));
        if (call.name.empty() || !value.is_object()) return std::nullopt;
        call.arguments = compact(value);
        calls.push_back(std::move(call));
      } else {
        auto some = calls_from_json_text(part);
        if (!some) return std::nullopt;
        for (auto& call : *some) calls.push_back(std::move(call));
      }
      if (next == std::string_view::npos) break;
      from = next + std::string_view("[TOOL_CALLS]").size();
    }
    return calls;
  }

  tool_call_syntax syntax_;
  std::string held_;
  std::string blank_;    // content blanks not yet passed on
  std::string opening_;  // the marker that began the calls, for text that turns out not to be one
  bool in_calls_ = false;
  bool at_start_ = true;  // llama3_json: only blanks so far
  bool called_ = false;
};

// gpt-oss's harmony messages: [<|start|>assistant]<|channel|>C[ to=R][ <|constrain|>json]<|message|>BODY
// ended by <|end|> (another message follows), <|call|> or <|return|> (both end the output, and as
// end tokens are usually not in the text). Channel analysis is reasoning, final the answer,
// commentary to=functions.NAME a call of NAME. Output that does not begin like a message is content.
class harmony_parser {
 public:
  harmony_parser(bool parse_tool_calls, bool parse_reasoning)
      : parse_tool_calls_(parse_tool_calls), parse_reasoning_(parse_reasoning) {}

  void push(std::string_view text, parsed_output& out) {
    held_ += text;
    for (;;) {
      if (state_ == state::plain) {
        out.content += held_;
        held_.clear();
        return;
      }
      if (state_ == state::header) {
        const size_t body = held_.find(message_marker);
        if (body == std::string::npos) {
          if (!could_begin_header(held_)) state_ = state::plain;
          if (state_ == state::plain) continue;
          return;
        }
        read_header(std::string_view(held_).substr(0, body));
        held_.erase(0, body + message_marker.size());
        state_ = state::body;
        continue;
      }
      size_t end = std::string::npos;
      std::string_view marker;
      for (std::string_view m : {std::string_view("<|end|>"), std::string_view("<|call|>"),
                                 std::string_view("<|return|>"), std::string_view("<|start|>")}) {
        const size_t at = held_.find(m);
        if (at < end) {
          end = at;
          marker = m;
        }
      }
      if (end != std::string::npos) {
        body_ += held_.substr(0, end);
        close_message(out);
        // A new message's <|start|> belongs to its header.
        held_.erase(0, end + (marker == "<|start|>" ? 0 : marker.size()));
        state_ = state::header;
        continue;
      }
      size_t keep = 0;
      for (std::string_view m : {"<|end|>", "<|call|>", "<|return|>", "<|start|>"}) {
        keep = std::max(keep, partial_marker(held_, m));
      }
      body_ += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      if (!is_call()) flush_body(out);
      return;
    }
  }

  void finish(parsed_output& out) {
    if (state_ == state::body) {
      body_ += held_;
      close_message(out);
    } else if (!trim(held_).empty()) {
      out.content += held_;  // text that never became a message
    }
    held_.clear();
  }

 private:
  static constexpr std::string_view message_marker = "<|message|>";

  // Whether `text` (no <|message|> yet) may still become a message header.
  static bool could_begin_header(std::string_view text) {
    if (text.size() > 512) return false;
    for (std::string_view opening : {"<|start|>", "<|channel|>", " to=", "to="}) {
      if (text.starts_with(opening) || opening.starts_with(text)) return true;
    }
    return false;
  }

  // Word after `key` in the header, up to a blank or the next marker.
  static std::string word_after(std::string_view header, std::string_view key) {
    const size_t at = header.find(key);
    if (at == std::string_view::npos) return {};
    std::string_view rest = header.substr(at + key.size());
    const size_t end = rest.find_first_of(" \t\r\n<");
    return std::string(rest.substr(0, end));
  }

  void read_header(std::string_view header) {
    channel_ = word_after(header, "<|channel|>");
    recipient_ = word_after(header, "to=");
    body_.clear();
  }

  bool is_call() const { return parse_tool_calls_ && !recipient_.empty() && recipient_ != "assistant"; }

  void flush_body(parsed_output& out) {
    if (channel_ == "analysis" && parse_reasoning_) {
      out.reasoning += body_;
    } else {
      out.content += body_;
    }
    body_.clear();
  }

  void close_message(parsed_output& out) {
    if (!is_call()) {
      flush_body(out);
      return;
    }
    parsed_tool_call call;
    call.name = recipient_.starts_with("functions.") ? recipient_.substr(10) : recipient_;
    const ordered_json args = parse_json(trim(body_));
    if (args.is_object() && !call.name.empty()) {
      call.arguments = compact(args);
      out.tool_calls.push_back(std::move(call));
    } else {
      out.content += body_;  // not a call after all: what the model wrote is kept
    }
    body_.clear();
  }

  enum class state { header, body, plain };
  state state_ = state::header;
  std::string held_;
  std::string body_;  // the current message's body not yet passed on (all of it, for a call)
  std::string channel_;
  std::string recipient_;
  bool parse_tool_calls_;
  bool parse_reasoning_;
};

}  // namespace

void parsed_output::append(parsed_output&& more) {
  reasoning += more.reasoning;
  content += more.content;
  for (auto& call : more.tool_calls) tool_calls.push_back(std::move(call));
}

std::optional<parsed_tool_call> tool_call_from_json(std::string_view json_text) {
  return call_from_value(parse_json(json_text));
}

struct chat_output_parser::impl {
  output_parsing how;
  std::optional<think_splitter> think;
  std::optional<tool_call_extractor> tools;
  std::optional<harmony_parser> harmony;

  explicit impl(output_parsing h) : how(h) {
    const bool harmony_output =
        h.format.reasoning == reasoning_syntax::harmony || h.format.tools == tool_call_syntax::harmony;
    if (harmony_output) {
      harmony.emplace(h.parse_tool_calls, h.parse_reasoning);
      return;
    }
    if (h.parse_reasoning && h.format.reasoning == reasoning_syntax::think) think.emplace(h.starts_in_reasoning);
    if (h.parse_tool_calls && h.format.tools != tool_call_syntax::none) tools.emplace(h.format.tools);
  }

  void pass_answer(std::string_view text, parsed_output& out) {
    if (tools) {
      tools->push(text, out);
    } else {
      out.content += text;
    }
  }
};

chat_output_parser::chat_output_parser(output_parsing how) : impl_(std::make_unique<impl>(how)) {}
chat_output_parser::~chat_output_parser() = default;
chat_output_parser::chat_output_parser(chat_output_parser&&) noexcept = default;
chat_output_parser& chat_output_parser::operator=(chat_output_parser&&) noexcept = default;

parsed_output chat_output_parser::push(std::string_view text) {
  parsed_output out;
  auto& s = *impl_;
  if (s.harmony) {
    s.harmony->push(text, out);
  } else if (s.think) {
    const std::string answer = s.think->push(text, out.reasoning);
    s.pass_answer(answer, out);
  } else {
    s.pass_answer(text, out);
  }
  return out;
}

parsed_output chat_output_parser::finish() {
  parsed_output out;
  auto& s = *impl_;
  if (s.harmony) {
    s.harmony->finish(out);
    return out;
  }
  if (s.think) s.pass_answer(s.think->finish(out.reasoning), out);
  if (s.tools) s.tools->finish(out);
  return out;
}

}  // namespace troupe
