#pragma once
// [pipeline] stages placed on [[nodes]] ({ node = NAME, layers = "0-15" }, issue 27): the
// endpoint the engine connects to, and the `troupe stage` process `troupe launch` starts for each
// (supervised as its node's restart says, like a `troupe node`). Such a stage listens on its
// node's address; with the cluster's credentials it is curve:// and admits members only.

#include <filesystem>
#include <string>
#include <vector>

#include "node/node_launcher.hpp"
#include "node/topology.hpp"

namespace troupe {

// [pipeline] nodes = [...]: cuts the model into one stage per node and the controller's (the
// last), of about equal bytes as its files' headers weigh them (model/loader/model_part_bytes.hpp),
// and turns them into stages placed on those nodes, logging each stage's layers and bytes.
// Nothing without nodes. Throws naming the model path, or when there are more stages than layers.
void split_pipeline_by_bytes(topology& t);

// Rewrites the endpoint of every stage placed on a node: with [cluster] credentials,
// curve://HOST:PORT/KEY with the node's public CURVE key (NAME.kv.key there), else
// kvtcp://HOST:PORT as parsed. Throws std::runtime_error naming a missing key file.
void resolve_pipeline_stage_endpoints(topology& t);

// A stage `troupe launch` starts on this machine, and how it is restarted.
struct stage_process {
  child_spec spec;
  restart_mode restart = restart_mode::on_failure;
};

// The `troupe stage` processes of the stages placed on nodes whose host is this machine, in
// stage order: `BINARY stage --model PATH --layers L --host H --port P --block-size B ...`, with
// `--credentials DIR --name NODE` when the cluster has credentials; up once it logs that it
// listens. A stage on another host is left out (start it there).
std::vector<stage_process> local_stage_processes(const topology& t, const std::filesystem::path& troupe_binary,
                                                 const std::string& log_level);

}  // namespace troupe
