// [pipeline] stages placed on [[nodes]] (issue 27): the endpoint the engine connects to (curve://
// with the node's public key when the cluster has credentials) and the `troupe stage` processes
// `troupe launch` starts on this machine.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kvtransfer/kv_channel.hpp"
#include "node/pipeline_placement.hpp"
#include "tests/scratch_dir.hpp"
#include "tests/shared_models.hpp"

namespace troupe {
namespace {

bool has_pair(const std::vector<std::string>& argv, const std::string& flag, const std::string& value) {
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == flag && argv[i + 1] == value) return true;
  }
  return false;
}

const std::string two_stage_nodes =
    "[model]\npath = \"/models/m\"\n[scheduler]\nblock_size = 32\n"
    "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.1:7201\"\nrestart = \"always\"\n"
    "[[nodes]]\nname = \"far\"\naddress = \"10.1.2.3:7202\"\n"
    "[pipeline]\nstages = [{ node = \"a\", layers = \"0-1\" }, { node = \"far\", layers = \"2-3\" }]\n";

TEST(pipeline_placement, without_credentials_stages_are_plain_tcp_and_launch_starts_the_local_ones) {
  topology t = parse_topology(two_stage_nodes);
  resolve_pipeline_stage_endpoints(t);
  EXPECT_EQ(t.pipeline.stages[0].endpoint, "kvtcp://127.0.0.1:7201");
  EXPECT_EQ(t.pipeline.stages[1].endpoint, "kvtcp://10.1.2.3:7202");
  const std::vector<stage_process> here = local_stage_processes(t, "/bin/troupe", "info");
  ASSERT_EQ(here.size(), 1u) << "the stage on another host is started there, not here";
  const child_spec& spec = here[0].spec;
  EXPECT_EQ(spec.name, "a");
  EXPECT_EQ(here[0].restart, restart_mode::always);
  ASSERT_GE(spec.argv.size(), 2u);
  EXPECT_EQ(spec.argv[0], "/bin/troupe");
  EXPECT_EQ(spec.argv[1], "stage");
  EXPECT_TRUE(has_pair(spec.argv, "--model", "/models/m"));
  EXPECT_TRUE(has_pair(spec.argv, "--layers", "0-1"));
  EXPECT_TRUE(has_pair(spec.argv, "--host", "127.0.0.1"));
  EXPECT_TRUE(has_pair(spec.argv, "--port", "7201"));
  EXPECT_TRUE(has_pair(spec.argv, "--block-size", "32")) << "the stage's KV blocks must be the engine's";
  EXPECT_EQ(std::find(spec.argv.begin(), spec.argv.end(), "--credentials"), spec.argv.end());
  EXPECT_EQ(spec.ready_text, "pipeline stage 0-1 listening on");
}

TEST(pipeline_placement, with_credentials_stages_are_curve_with_the_nodes_key_and_get_the_credentials) {
  const troupe::testing::scratch_dir dir;
  write_kv_channel_keys(dir.path(), "a");
  write_kv_channel_keys(dir.path(), "far");
  topology t = parse_topology(two_stage_nodes + "[cluster]\ncredentials = \"" + dir.path().string() + "\"\n");
  resolve_pipeline_stage_endpoints(t);
  EXPECT_EQ(t.pipeline.stages[0].endpoint,
            "curve://127.0.0.1:7201/" + load_kv_channel_keys(dir.path(), "a").public_key);
  EXPECT_EQ(t.pipeline.stages[1].endpoint,
            "curve://10.1.2.3:7202/" + load_kv_channel_keys(dir.path(), "far").public_key);
  const std::vector<stage_process> here = local_stage_processes(t, "/bin/troupe", "info");
  ASSERT_EQ(here.size(), 1u);
  EXPECT_TRUE(has_pair(here[0].spec.argv, "--credentials", dir.path().string()));
  EXPECT_TRUE(has_pair(here[0].spec.argv, "--name", "a"));
}

TEST(pipeline_placement, a_node_without_its_curve_key_is_named) {
  const troupe::testing::scratch_dir dir;
  write_kv_channel_keys(dir.path(), "far");
  topology t = parse_topology(two_stage_nodes + "[cluster]\ncredentials = \"" + dir.path().string() + "\"\n");
  try {
    resolve_pipeline_stage_endpoints(t);
    FAIL() << "resolved a stage whose node has no key";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("a.kv.key"), std::string::npos) << e.what();
  }
}

// [pipeline] nodes = [...]: the model weighed by its headers and cut so that no stage holds more
// than it must; stories260K's five f32 layers over two nodes and the controller (the bytes are
// in tests/model/layer_range_test.cpp).
TEST(pipeline_placement, nodes_split_the_model_by_bytes_with_the_controller_holding_the_last_stage) {
  TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "hf");
  topology t = parse_topology("[model]\npath = \"" + (test::stories260k_dir / "hf").string() +
                              "\"\n[[nodes]]\nname = \"a\"\naddress = \"127.0.0.1:7201\"\n"
                              "[[nodes]]\nname = \"b\"\naddress = \"127.0.0.1:7202\"\n"
                              "[pipeline]\nnodes = [\"a\", \"b\"]\n");
  EXPECT_TRUE(t.pipeline.stages.empty()) << "cut when the model is known, after the flags";
  split_pipeline_by_bytes(t);
  ASSERT_EQ(t.pipeline.stages.size(), 2u);
  EXPECT_EQ(t.pipeline.stages[0].layers, (layer_range{0, 2}));
  EXPECT_EQ(t.pipeline.stages[1].layers, (layer_range{2, 4}));
  EXPECT_EQ(t.pipeline.engine_layers().first, 4) << "the controller's engine holds layer 4 and the head";
  EXPECT_EQ(t.pipeline_stage_nodes, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(t.pipeline_split_nodes.empty());
  resolve_pipeline_stage_endpoints(t);
  EXPECT_EQ(t.pipeline.stages[1].endpoint, "kvtcp://127.0.0.1:7202");
  t.validate();
  const std::vector<stage_process> here = local_stage_processes(t, "/bin/troupe", "info");
  ASSERT_EQ(here.size(), 2u);
  EXPECT_TRUE(has_pair(here[0].spec.argv, "--layers", "0-1"));
  EXPECT_TRUE(has_pair(here[1].spec.argv, "--layers", "2-3"));
}

// With a memory budget on every stage ([[nodes]] memory_budget_mb, the controller's [node] one),
// the split fills them in proportion to what each has beside its KV pool: here 1, 1 and 4 MiB,
// so the controller takes three of the five layers where the even split gave it one. Each stage
// process is started with its own node's budget.
TEST(pipeline_placement, nodes_with_memory_budgets_are_filled_in_proportion) {
  TROUPE_REQUIRE_SHARED_MODEL(test::stories260k_dir / "hf");
  topology t = parse_topology("[model]\npath = \"" + (test::stories260k_dir / "hf").string() +
                              "\"\n[node]\nmemory_budget_mb = 5\n[scheduler]\nkv_memory_mb = 1\n"
                              "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.1:7201\"\nmemory_budget_mb = 2\n"
                              "[[nodes]]\nname = \"b\"\naddress = \"127.0.0.1:7202\"\nmemory_budget_mb = 2\n"
                              "[pipeline]\nnodes = [\"a\", \"b\"]\n");
  split_pipeline_by_bytes(t);
  ASSERT_EQ(t.pipeline.stages.size(), 2u);
  EXPECT_EQ(t.pipeline.stages[0].layers, (layer_range{0, 1}));
  EXPECT_EQ(t.pipeline.stages[1].layers, (layer_range{1, 2}));
  EXPECT_EQ(t.pipeline.engine_layers().first, 2);
  const std::vector<stage_process> here = local_stage_processes(t, "/bin/troupe", "info");
  ASSERT_EQ(here.size(), 2u);
  EXPECT_TRUE(has_pair(here[0].spec.argv, "--memory-budget-mb", "2")) << "the node's own budget, not [node]'s";

  topology cramped = parse_topology("[model]\npath = \"" + (test::stories260k_dir / "hf").string() +
                                    "\"\n[node]\nmemory_budget_mb = 5\n[scheduler]\nkv_memory_mb = 1\n"
                                    "[[nodes]]\nname = \"a\"\naddress = \"127.0.0.1:7201\"\nmemory_budget_mb = 1\n"
                                    "[pipeline]\nnodes = [\"a\"]\n");
  try {
    split_pipeline_by_bytes(cramped);
    FAIL() << "split over a node whose budget is all KV pool";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("a's memory budget of 1 MiB leaves nothing beside its KV pool of 1 MiB"),
              std::string::npos)
        << e.what();
  }
}

TEST(pipeline_placement, nodes_to_split_over_are_checked_by_name) {
  const std::string model = "[model]\npath = \"/models/m\"\n[[nodes]]\nname = \"a\"\naddress = \"127.0.0.1:7201\"\n";
  auto error_of = [&](const std::string& pipeline) {
    try {
      topology t = parse_topology(model + "[pipeline]\n" + pipeline);
      split_pipeline_by_bytes(t);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("nodes = [\"z\"]\n").find("'z' is not a [[nodes]] name"), std::string::npos);
  EXPECT_NE(error_of("nodes = [\"a\", \"a\"]\n").find("'a' is listed twice"), std::string::npos);
  EXPECT_NE(error_of("nodes = [\"a\"]\nstages = [{ node = \"a\", layers = \"0-1\" }]\n").find("both stages and nodes"),
            std::string::npos);
  EXPECT_NE(error_of("nodes = [\"a\"]\n").find("/models/m"), std::string::npos) << "a model that is not there";
}

}  // namespace
}  // namespace troupe
