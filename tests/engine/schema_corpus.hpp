#pragma once
// A corpus of JSON schemas of the shapes APIs use (records with nested objects, arrays with
// bounds, enums, required and optional fields, string patterns and formats, numbers with
// ranges, nullable fields, anyOf, $defs/$ref), built from a seed so every run checks the same
// ones. Used by the structured-output tests and the mask benchmark.

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::testing {

class schema_corpus_builder {
 public:
  explicit schema_corpus_builder(uint64_t seed) : rng_(seed) {}

  nlohmann::ordered_json next() {
    defs_ = nlohmann::ordered_json::object();
    nlohmann::ordered_json schema = object(0);
    if (!defs_.empty()) schema["$defs"] = defs_;
    return schema;
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(int percent) { return pick(1, 100) <= percent; }

  nlohmann::ordered_json object(int depth) {
    static const char* names[] = {"id",     "name",    "email",  "age",      "price", "tags",  "address",
                                  "status", "created", "score",  "items",    "owner", "count", "active",
                                  "code",   "notes",   "rating", "location", "phone", "kind"};
    nlohmann::ordered_json props = nlohmann::ordered_json::object();
    std::vector<std::string> required;
    const int n = pick(1, depth == 0 ? 5 : 3);
    std::vector<int> used;
    for (int i = 0; i < n; ++i) {
      int k = pick(0, 19);
      while (std::find(used.begin(), used.end(), k) != used.end()) k = (k + 1) % 20;
      used.push_back(k);
      props[names[k]] = value(depth + 1);
      if (chance(60)) required.push_back(names[k]);
    }
    nlohmann::ordered_json s = {{"type", "object"}, {"properties", props}};
    if (!required.empty()) s["required"] = required;
    if (chance(30)) s["additionalProperties"] = false;
    return s;
  }

  nlohmann::ordered_json value(int depth) {
    const int kind = pick(0, depth >= 3 ? 9 : 13);
    switch (kind) {
      case 0: return {{"type", "string"}};
      case 1: return {{"type", "string"}, {"minLength", pick(0, 3)}, {"maxLength", pick(4, 12)}};
      case 2: {
        static const char* patterns[] = {"^[A-Z]{3}-[0-9]{4}$",         "^[a-z]+(-[a-z]+)*$", "^\\+?[0-9]{7,12}$",
                                         "^(red|green|blue)$",          "[0-9]{2}",           "^[A-Za-z ]{1,20}$",
                                         "^v[0-9]+\\.[0-9]+\\.[0-9]+$", "^#[0-9a-fA-F]{6}$"};
        return {{"type", "string"}, {"pattern", patterns[pick(0, 7)]}};
      }
      case 3: {
        static const char* formats[] = {"date", "date-time", "email", "uuid", "ipv4", "time"};
        return {{"type", "string"}, {"format", formats[pick(0, 5)]}};
      }
      case 4: {
        const int lo = pick(-50, 50);
        nlohmann::ordered_json s = {{"type", "integer"}};
        if (chance(80)) s["minimum"] = lo;
        if (chance(80)) s["maximum"] = lo + pick(0, 2000);
        if (chance(20)) s["exclusiveMaximum"] = lo + 3000;
        return s;
      }
      case 5: {
        nlohmann::ordered_json s = {{"type", "number"}};
        const double lo = pick(-1000, 1000) / 10.0;
        if (chance(70)) s[chance(50) ? "minimum" : "exclusiveMinimum"] = lo;
        if (chance(70)) s[chance(50) ? "maximum" : "exclusiveMaximum"] = lo + pick(2, 5000) / 10.0;
        return s;
      }
      case 6: return {{"type", "boolean"}};
      case 7: {
        static const std::vector<std::vector<std::string>> enums = {{"draft", "published", "archived"},
                                                                    {"S", "M", "L", "XL"},
                                                                    {"low", "medium", "high", "critical"},
                                                                    {"cat", "dog", "bird"}};
        return {{"enum", enums[static_cast<size_t>(pick(0, 3))]}};
      }
      case 8: return {{"type", nlohmann::ordered_json::array({chance(50) ? "string" : "integer", "null"})}};
      case 9: return {{"enum", nlohmann::ordered_json::array({1, 2.5, "x", nullptr, true})}};
      case 10: {
        nlohmann::ordered_json s = {{"type", "array"}, {"items", value(depth + 1)}};
        const int min = pick(0, 2);
        if (chance(70)) s["minItems"] = min;
        if (chance(70)) s["maxItems"] = min + pick(0, 3);
        return s;
      }
      case 11: return object(depth);
      case 12: return {{"anyOf", nlohmann::ordered_json::array({value(depth + 1), {{"type", "null"}}})}};
      default: {
        const std::string name = "def" + std::to_string(defs_.size());
        defs_[name] = object(depth + 1);
        return {{"$ref", "#/$defs/" + name}};
      }
    }
  }

  std::mt19937_64 rng_;
  nlohmann::ordered_json defs_;
};

}  // namespace troupe::testing
