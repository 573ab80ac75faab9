// troupe certs: the cluster's private CA and its members' certificates (node/cluster_credentials).

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/command_registry.hpp"
#include "node/cluster_member_issuer.hpp"

namespace troupe::cli {
namespace {

struct certs_flags {
  std::string out;
  std::string cluster = "troupe";
  std::vector<std::string> names;
  int days = 365;
  int ca_days = 3650;
  bool replace = false;
};

int run(const certs_flags& flags) {
  const std::filesystem::path dir = flags.out;
  if (!std::filesystem::exists(dir / "ca.crt")) {
    make_cluster_ca(dir, flags.cluster, flags.ca_days);
    std::cout << "made the cluster CA: " << (dir / "ca.crt").string() << " (its key " << (dir / "ca.key").string()
              << " signs members: keep it off the nodes)\n";
  }
  for (const std::string& name : flags.names) {
    const member_credentials files = issue_cluster_member(dir, name, flags.days, flags.replace);
    std::cout << "issued " << name << ": " << files.certificate.string() << ", " << files.private_key.string() << "\n";
    std::cout << "  KV channel keys: " << (dir / (name + ".kv.key")).string() << ", "
              << (dir / (name + ".kv.pub")).string() << " (copy every *.kv.pub to every member)\n";
  }
  return 0;
}

const bool registered = register_command([](CLI::App& parent) {
  auto f = std::make_shared<certs_flags>();
  auto* app = parent.add_subcommand(
      "certs", "make the cluster's private CA (once) and a certificate per member: nodes, controllers, admins");
  app->add_option("--out", f->out, "credentials directory (ca.crt, ca.key, NAME.crt, NAME.key)")->required();
  app->add_option("--name", f->names, "a member to issue a certificate for (repeatable), e.g. controller, node1");
  app->add_option("--cluster", f->cluster, "the CA's name, when it is made")->capture_default_str();
  app->add_option("--days", f->days, "members' certificates are valid this long")->capture_default_str();
  app->add_option("--ca-days", f->ca_days, "the CA is valid this long, when it is made")->capture_default_str();
  app->add_flag("--replace", f->replace, "issue a member's certificate anew when it exists");
  return command{app, [f] { return run(*f); }};
});

}  // namespace
}  // namespace troupe::cli
