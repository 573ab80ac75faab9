// The files a topology names, checked before anything starts: the model, the draft model and the
// credentials of the members that run here, each missing one named with the key and the members
// that need it; members elsewhere are not checked here (their own node refuses the placement).

#include <gtest/gtest.h>

#include <fstream>

#include "node/topology.hpp"
#include "node/topology_files.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe {
namespace {

using troupe::testing::scratch_dir;

class topology_files : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.path() / "model");
    std::filesystem::create_directories(dir_.path() / "certs");
    for (const char* file : {"ca.crt", "controller.crt", "controller.key", "n1.crt", "n1.key"}) {
      std::ofstream(dir_.path() / "certs" / file) << "x";
    }
  }
  // Engines on n1 (here) and n2 (elsewhere); tokenizers and detokenizers on the controller.
  topology two_nodes(const std::string& model, const std::string& draft = "") const {
    std::string text = "[model]\npath = \"" + model + "\"\n[cluster]\ncredentials = \"" +
                       (dir_.path() / "certs").string() + "\"\n" +
                       "[[nodes]]\nname = \"n1\"\naddress = \"127.0.0.1:4501\"\n"
                       "[[nodes]]\nname = \"n2\"\naddress = \"10.0.0.2:4501\"\n"
                       "[placement]\nengines = [\"n1\", \"n2\"]\n";
    if (!draft.empty()) text += "[speculative]\nnum_draft_tokens = 2\ndraft_model = \"" + draft + "\"\n";
    return parse_topology(text);
  }
  std::string model() const { return (dir_.path() / "model").string(); }

  scratch_dir dir_;
};

TEST_F(topology_files, a_topology_whose_files_exist_passes) {
  EXPECT_TRUE(missing_topology_files(two_nodes(model(), model()), {"controller", "n1"}).empty());
  EXPECT_NO_THROW(check_topology_files(two_nodes(model()), {"controller", "n1"}, "t.toml"));
}

TEST_F(topology_files, a_missing_model_path_is_named_with_the_members_that_need_it) {
  const std::string missing = (dir_.path() / "no-such-model").string();
  const auto found = missing_topology_files(two_nodes(missing), {"controller", "n1"});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0], "[model] path '" + missing + "' does not exist (the stages on controller and n1)");
  try {
    check_topology_files(two_nodes(missing), {"controller"}, "t.toml");
    FAIL() << "a missing model path passed";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "t.toml: [model] path '" + missing + "' does not exist (the stages on controller)");
  }
  // A member with no stage here needs no model: n2 runs elsewhere, and the check is its own.
  topology elsewhere = two_nodes(missing);
  elsewhere.placement.tokenizers = {"n2"};
  elsewhere.placement.detokenizers = {"n2"};
  elsewhere.placement.engines = {"n2"};
  EXPECT_TRUE(missing_topology_files(elsewhere, {"controller"}).empty());
}

TEST_F(topology_files, a_missing_draft_model_is_named_for_the_engines_here_only) {
  const std::string missing = (dir_.path() / "no-such-draft").string();
  const auto found = missing_topology_files(two_nodes(model(), missing), {"controller", "n1"});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0], "[speculative] draft_model '" + missing + "' does not exist (the engines on n1)");
  // The controller runs no engine: its own check does not need the draft.
  EXPECT_TRUE(missing_topology_files(two_nodes(model(), missing), {"controller"}).empty());
}

TEST_F(topology_files, missing_credentials_are_named_file_by_file) {
  std::filesystem::remove(dir_.path() / "certs" / "n1.key");
  const auto found = missing_topology_files(two_nodes(model()), {"controller", "n1"});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_NE(found[0].find("n1.key' does not exist (n1;"), std::string::npos) << found[0];
  std::filesystem::remove_all(dir_.path() / "certs");
  const auto none = missing_topology_files(two_nodes(model()), {"controller", "n1"});
  ASSERT_EQ(none.size(), 1u);
  EXPECT_NE(none[0].find("[cluster] credentials '"), std::string::npos) << none[0];
  EXPECT_NE(none[0].find("(controller and n1; make it with `troupe certs`)"), std::string::npos) << none[0];
}

}  // namespace
}  // namespace troupe
