#pragma once
// A local launch's private CA: `troupe launch` of a topology whose members all run on this
// machine (every [[nodes]] address on 127.0.0.1 or localhost) and that names no [cluster]
// credentials makes a CA and a certificate for each member (the controller, every node, and
// `admin` when an admin door is open) in its state directory, with the code `troupe certs` runs,
// and uses them. They are made once and reused by later launches of the same topology. A
// topology with a node on another machine still needs credentials from `troupe certs`, copied
// to every machine: the launch cannot put them there.

#include <filesystem>
#include <optional>
#include <string>

#include "node/topology.hpp"

namespace troupe {

// Where launch keeps the state of the topology file at `topology_file` when --state-dir is not
// given: $XDG_STATE_HOME (else ~/.local/state)/troupe/launch/STEM-HASH, HASH from the file's
// absolute path so two topologies of one name do not share a CA. Throws when neither variable
// is set.
std::filesystem::path default_launch_state_dir(const std::filesystem::path& topology_file);

struct launch_credentials {
  std::filesystem::path dir;  // state_dir/credentials
  int num_issued = 0;         // members issued now (0: every one was there from an earlier launch)
  bool made_ca = false;
};

// For `t` as read (not validated yet: validation asks for the credentials this may provide):
// nullopt when it names credentials or needs none (every stage on the controller, no admin
// door); else the private credentials in `state_dir`, made or completed now. Throws naming the
// node when one runs on another machine.
std::optional<launch_credentials> local_launch_credentials(const topology& t, const std::filesystem::path& state_dir,
                                                           const std::string& source);

}  // namespace troupe
