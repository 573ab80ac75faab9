// troupe tokenize: text -> ids (or ids -> text with --decode) with a model's own tokenizer, from
// an HF directory, a tokenizer.json or a GGUF file; --chat prints a conversation rendered through
// the model's chat template (--json: with its ids).

#include <climits>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/command_registry.hpp"
#include "model/loader/tokenizer_sources.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

namespace troupe::cli {
namespace {

struct tokenize_flags {
  std::string tokenizer_path;
  bool decode = false;
  std::string chat_file;
  bool no_special = false;
  bool json = false;
  std::vector<std::string> text;
};

std::string read_stdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? " " : "") + parts[i];
  return out;
}

// Ids as a JSON array, or separated by spaces, commas or newlines.
std::vector<std::int32_t> parse_ids(const std::string& text) {
  std::vector<std::int32_t> ids;
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    for (const auto& id : nlohmann::json::parse(text)) {
      if (!id.is_number_integer() || id.get<long long>() < INT32_MIN || id.get<long long>() > INT32_MAX)
        throw std::runtime_error("--decode expects token ids (integers), got " + id.dump());
      ids.push_back(static_cast<std::int32_t>(id.get<long long>()));
    }
    return ids;
  }
  std::string cleaned = text;
  for (char& c : cleaned)
    if (c == ',') c = ' ';
  std::istringstream in(cleaned);
  std::string word;
  while (in >> word) {
    try {
      std::size_t used = 0;
      const long long value = std::stoll(word, &used);
      if (used != word.size() || value < INT32_MIN || value > INT32_MAX) throw std::invalid_argument(word);
      ids.push_back(static_cast<std::int32_t>(value));
    } catch (const std::exception&) {
      throw std::runtime_error("--decode expects token ids (integers), got '" + word + "'");
    }
  }
  return ids;
}

nlohmann::json read_messages(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open chat file " + path);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("chat file " + path + " is not valid JSON: " + e.what());
  }
  // Either a list of messages or an OpenAI-style request body with "messages".
  if (doc.is_object() && doc.contains("messages")) doc = doc["messages"];
  if (!doc.is_array())
    throw std::runtime_error("chat file " + path + " must hold a JSON array of {role, content} messages");
  // Checked here, so a malformed message is named instead of failing deep inside a template.
  for (std::size_t i = 0; i < doc.size(); ++i) {
    const auto& message = doc[i];
    const std::string where = "chat file " + path + ", message " + std::to_string(i);
    if (!message.is_object()) throw std::runtime_error(where + ": expected an object {role, content}");
    if (!message.contains("role") || !message["role"].is_string())
      throw std::runtime_error(where + ": needs a string \"role\"");
    if (!message.contains("content") && !message.contains("tool_calls"))
      throw std::runtime_error(where + ": needs \"content\" (or \"tool_calls\")");
  }
  return doc;
}

int run(const tokenize_flags& flags) {
  const tokenizer_sources sources = load_tokenizer_sources(flags.tokenizer_path);
  const tokenizer tok = tokenizer::from_json(sources.tokenizer_json, sources.tokenizer_config);

  if (flags.decode) {
    const auto ids = parse_ids(flags.text.empty() ? read_stdin() : join(flags.text));
    for (std::int32_t id : ids) {
      if (id < 0 || id >= tok.vocab_size())
        throw std::runtime_error("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                 std::to_string(tok.vocab_size() - 1) + ")");
    }
    const std::string text = tok.decode(ids, flags.no_special);
    if (flags.json)
      std::cout << nlohmann::json{{"text", text}, {"ids", ids}}.dump() << "\n";
    else
      std::cout << text << "\n";
    return 0;
  }

  std::string text;
  bool add_special_tokens = !flags.no_special;
  if (!flags.chat_file.empty()) {
    const nlohmann::json messages = read_messages(flags.chat_file);
    if (tok.chat_template_source().empty())
      throw std::runtime_error("the tokenizer at " + flags.tokenizer_path + " has no chat_template");
    const chat_template tmpl(tok.chat_template_source());
    text = tmpl.apply(messages, true, tok.bos_token(), tok.eos_token());
    // The template writes BOS itself where the model wants one (as transformers' apply_chat_template).
    add_special_tokens = false;
    // The rendered prompt is what a template user needs to see; --json adds its ids.
    if (!flags.json) {
      std::cout << text << "\n";
      return 0;
    }
  } else {
    text = flags.text.empty() ? read_stdin() : join(flags.text);
  }
  const auto ids = tok.encode(text, add_special_tokens);
  if (flags.json) {
    nlohmann::json tokens = nlohmann::json::array();
    for (std::int32_t id : ids) tokens.push_back(tok.id_to_token(id));
    std::cout << nlohmann::json{{"text", text}, {"ids", ids}, {"tokens", tokens}}.dump(
                     -1, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
    return 0;
  }
  for (std::size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
  return 0;
}

const bool registered = register_command([](CLI::App& parent) {
  auto flags = std::make_shared<tokenize_flags>();
  auto* app = parent.add_subcommand("tokenize", "encode text to token ids, or decode ids to text");
  app->add_option("--tokenizer", flags->tokenizer_path, "HF model directory, tokenizer.json or .gguf file")->required();
  app->add_flag("--decode", flags->decode, "read token ids and print the text");
  app->add_option("--chat", flags->chat_file,
                  "JSON file of chat messages: print them rendered with the chat template (--json: and their ids)");
  app->add_flag("--no-special", flags->no_special, "encode without BOS/EOS; decode skipping special tokens");
  app->add_flag("--json", flags->json, "print JSON: text, ids (and tokens)");
  app->add_option("text", flags->text, "text (or ids with --decode); read verbatim from stdin when absent");
  return command{app, [flags] { return run(*flags); }};
});

}  // namespace
}  // namespace troupe::cli
