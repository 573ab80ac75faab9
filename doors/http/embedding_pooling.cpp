#include "doors/http/embedding_pooling.hpp"

#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace troupe {

namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(path.string() + " is not JSON: " + e.what());
  }
}

}  // namespace

pooling_settings read_pooling_settings(const std::filesystem::path& model_path) {
  pooling_settings out;
  out.source = "the default (last token, normalized)";
  const std::filesystem::path dir = std::filesystem::is_directory(model_path) ? model_path : model_path.parent_path();
  const std::filesystem::path modules_path = dir / "modules.json";
  if (!std::filesystem::exists(modules_path)) return out;
  const nlohmann::json modules = read_json(modules_path);
  if (!modules.is_array()) throw std::runtime_error(modules_path.string() + ": expected a list of modules");
  bool normalize = false;
  for (const auto& m : modules) {
    const std::string type = m.value("type", "");
    if (type.find("Normalize") != std::string::npos) normalize = true;
    if (type.find("Pooling") == std::string::npos) continue;
    const std::filesystem::path config_path = dir / m.value("path", "") / "config.json";
    const nlohmann::json c = read_json(config_path);
    if (c.value("pooling_mode_mean_tokens", false)) {
      out.pooling = pooling_kind::mean;
    } else if (c.value("pooling_mode_lasttoken", false)) {
      out.pooling = pooling_kind::last;
    } else {
      throw std::runtime_error(
          config_path.string() +
          ": its pooling mode is not served (mean tokens and last token are; CLS, max and weighted "
          "mean are not)");
    }
    out.source = config_path.string();
  }
  out.normalize = normalize;
  return out;
}

}  // namespace troupe
