// The flags of a node, declared once for both fronts that start one: `dsec serve` (the embedded single-node
// fleet) and `dsec-launch` (a node of a Slurm fleet). They cover the node core (NodeOptions: root, names,
// admission, reaper, cgroup parent, simulate, fncall, density, memory capacity, CPU QoS, user namespaces) and
// the HTTP edge both fronts share (HttpServerOptions: listen, connection budgets, request deadlines; the output
// budget). Usage:
//   ServeOptions options;
//   po::options_description desc;
//   NodeOptionTable table(&options, {...});
//   table.addTo(desc);
//   po::store(...); po::notify(vm);
//   Status st = table.apply(vm);  // on/off and size flags, then every range: errors name the flag
#pragma once

#include <boost/program_options.hpp>
#include <string>

#include "dsec/common/Result.h"
#include "dsec/launcher/api/Serve.h"

namespace dsec::launcher {

// Which of the shared flags a front takes from the table (a front that has its own way to set one leaves it out:
// `dsec serve` takes --root from the common options; dsec-launch builds the listen address from --address and
// --node-port and names its node after the Slurm node).
struct NodeTableParts {
  bool root = true;
  bool listen = true;
  bool node_name = true;
};

// $DSEC_ROOT, else /var/lib/dsec.
std::string defaultNodeRoot();

class NodeOptionTable {
 public:
  explicit NodeOptionTable(ServeOptions* options, NodeTableParts parts = {});

  // Adds every node and HTTP-edge flag, bound to the options (their current values are the defaults).
  void addTo(boost::program_options::options_description& desc);

  // After po::notify: reads the flags given as text (on/off switches, sizes) into the options and checks every
  // value; an error names the flag ("--max-sandboxes must be > 0").
  Status apply(const boost::program_options::variables_map& vm);

 private:
  ServeOptions* options_;
  NodeTableParts parts_;
};

// The checks apply() makes, on options however they were set; errors name the flag that sets the value.
Status validateNodeFlags(const ServeOptions& options);

}  // namespace dsec::launcher
