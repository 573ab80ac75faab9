#include "text/post_processor.hpp"

#include <stdexcept>
#include <string>

namespace troupe {
namespace {

void append_template(const nlohmann::json& config, const post_processor::token_lookup& lookup, post_processor& out) {
  bool after_sequence = false;
  for (const auto& item : config.at("single")) {
    if (item.contains("Sequence")) {
      after_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken")) throw std::runtime_error("TemplateProcessing: unexpected item " + item.dump());
    const std::string name = item["SpecialToken"].at("id").get<std::string>();
    std::vector<std::int32_t> ids;
    if (config.contains("special_tokens") && config["special_tokens"].contains(name)) {
      for (const auto& id : config["special_tokens"][name].at("ids")) ids.push_back(id.get<std::int32_t>());
    } else if (const auto id = lookup(name)) {
      ids.push_back(*id);
    } else {
      throw std::runtime_error("TemplateProcessing: special token '" + name + "' is not in the vocabulary");
    }
    auto& target = after_sequence ? out.suffix : out.prefix;
    target.insert(target.end(), ids.begin(), ids.end());
  }
}

void append_pair_processing(const nlohmann::json& config, post_processor& out) {
  // "cls": ["<s>", 0], "sep": ["</s>", 2]
  out.prefix.push_back(config.at("cls").at(1).get<std::int32_t>());
  out.suffix.push_back(config.at("sep").at(1).get<std::int32_t>());
}

void append(const nlohmann::json& config, const post_processor::token_lookup& lookup, post_processor& out) {
  if (config.is_null()) return;
  const std::string type = config.value("type", "");
  if (type == "TemplateProcessing")
    append_template(config, lookup, out);
  else if (type == "ByteLevel")
    return;
  else if (type == "BertProcessing" || type == "RobertaProcessing")
    append_pair_processing(config, out);
  else if (type == "Sequence")
    for (const auto& step : config.at("processors")) append(step, lookup, out);
  else
    throw std::runtime_error(
        "tokenizer.json post_processor type '" + type +
        "' is not supported (expected TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing or Sequence)");
}

}  // namespace

post_processor post_processor::from_json(const nlohmann::json& config, const token_lookup& lookup) {
  post_processor out;
  append(config, lookup, out);
  return out;
}

}  // namespace troupe
