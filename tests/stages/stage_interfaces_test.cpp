// The stages' typed interfaces (stages/stage_interfaces.hpp) against the table in
// docs/architecture.md ("Stage interfaces"): each row names a handle and lists what it takes, and
// must list exactly what the handle's type says, in CAF's own rendering of it (the registered
// names of stages/message_types.hpp; an atom by its text). A message added to an interface and
// not to the table, or the other way round, fails here.

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "stages/message_inspect.hpp"
#include "stages/message_types.hpp"
#include "stages/stage_interfaces.hpp"

namespace troupe {
namespace {

class registered_config : public caf::actor_system_config {
 public:
  registered_config() {
    for_each_message_type(
        [this](auto type, const char* name) { add_message_type<typename decltype(type)::type>(name); });
  }
};

// "caf::replies_to<engdrain,@i32>::with<bool>" → "engdrain, int32_t → bool"; a reply of void is
// left out.
std::string readable(const std::string& signature) {
  static const std::regex form(R"(caf::replies_to<(.*)>::with<(.*)>)");
  std::smatch m;
  if (!std::regex_match(signature, m, form)) return "unreadable: " + signature;
  auto names = [](std::string list) {
    static const std::map<std::string, std::string> builtin = {
        {"@i32", "int32_t"}, {"@i64", "int64_t"}, {"@str", "std::string"}, {"@strvec", "std::vector<std::string>"}};
    std::string out;
    std::stringstream in(list);
    for (std::string name; std::getline(in, name, ',');) {
      if (auto it = builtin.find(name); it != builtin.end()) name = it->second;
      out += (out.empty() ? "" : ", ") + name;
    }
    return out;
  };
  std::string out = names(m[1]);
  if (m[2] != "void") out += " → " + names(m[2]);
  return out;
}

template <class Handle>
std::set<std::string> interface_of(caf::actor_system& system) {
  std::set<std::string> out;
  for (const std::string& signature : system.message_types<Handle>()) out.insert(readable(signature));
  return out;
}

// The table's rows, by handle: the backticked entries of the row's third cell.
std::map<std::string, std::set<std::string>> documented_interfaces() {
  std::ifstream file(std::string(TROUPE_SOURCE_DIR) + "/docs/architecture.md");
  std::stringstream text;
  text << file.rdbuf();
  const std::string doc = text.str();
  const size_t start = doc.find("### Stage interfaces");
  if (start == std::string::npos) return {};
  const size_t end = doc.find("\n#", start + 1);
  std::stringstream section(doc.substr(start, end == std::string::npos ? std::string::npos : end - start));
  static const std::regex row(R"(^\|[^|]*\|\s*`([a-z_]+_handle)`\s*\|(.*)\|\s*$)");
  static const std::regex entry("`([^`]+)`");
  std::map<std::string, std::set<std::string>> out;
  for (std::string line; std::getline(section, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    const std::string cell = m[2];
    auto& entries = out[m[1]];
    for (std::sregex_iterator i(cell.begin(), cell.end(), entry), e; i != e; ++i) entries.insert((*i)[1]);
  }
  return out;
}

TEST(stage_interfaces, the_docs_table_lists_exactly_what_each_stage_takes) {
  registered_config config;
  caf::actor_system system(config);
  const std::map<std::string, std::set<std::string>> actual = {
      {"tokenizer_handle", interface_of<tokenizer_handle>(system)},
      {"router_handle", interface_of<router_handle>(system)},
      {"scheduler_handle", interface_of<scheduler_handle>(system)},
      {"worker_handle", interface_of<worker_handle>(system)},
      {"kv_agent_handle", interface_of<kv_agent_handle>(system)},
      {"detokenizer_handle", interface_of<detokenizer_handle>(system)},
      {"frontend_handle", interface_of<frontend_handle>(system)},
  };
  const auto documented = documented_interfaces();
  ASSERT_FALSE(documented.empty()) << "docs/architecture.md has no \"### Stage interfaces\" table";
  for (const auto& [handle, messages] : actual) {
    SCOPED_TRACE(handle);
    for (const std::string& m : messages) EXPECT_EQ(m.find("invalid-type"), std::string::npos) << "unnamed: " << m;
    auto row = documented.find(handle);
    ASSERT_NE(row, documented.end()) << "no row for it; its interface is:\n" << ::testing::PrintToString(messages);
    for (const std::string& m : messages) EXPECT_TRUE(row->second.contains(m)) << "not in the table: `" << m << "`";
    for (const std::string& m : row->second) EXPECT_TRUE(messages.contains(m)) << "not in the interface: `" << m << "`";
  }
  for (const auto& [handle, messages] : documented) {
    EXPECT_TRUE(actual.contains(handle)) << "the table names " << handle << ", which this test does not know";
  }
}

// What CAF renders is what the table is read as: a reply, a message with arguments, an atom.
TEST(stage_interfaces, signatures_read_as_the_table_writes_them) {
  EXPECT_EQ(readable("caf::replies_to<tokenize_request>::with<void>"), "tokenize_request");
  EXPECT_EQ(readable("caf::replies_to<loaded>::with<bool>"), "loaded → bool");
  EXPECT_EQ(readable("caf::replies_to<nodedrain,@str,@i32>::with<std::vector<int32_t>>"),
            "nodedrain, std::string, int32_t → std::vector<int32_t>");
  EXPECT_EQ(readable("caf::replies_to<englist>::with<@strvec>"), "englist → std::vector<std::string>");
}

}  // namespace
}  // namespace troupe
