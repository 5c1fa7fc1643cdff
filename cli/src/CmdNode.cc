// dsec node cleanup --job ID: destroys everything Slurm job ID left on this node (its fleet agents' sandboxes,
// their cgroups, processes, network namespaces and layer mounts), found from the job's claims in
// /run/dsec/jobs (launcher/node/JobOwnership.h). For a site's Epilog script (slurm-configs/dsec-epilog.sh);
// the SPANK plugin's job epilog does the same. Needs no agent; root. Exits 0 also when there was nothing.
#include <cstdlib>
#include <iostream>

#include "Commands.h"
#include "dsec/launcher/node/JobOwnership.h"

namespace dsec::cli {

int cmdNode(const Invocation& inv) {
  CommonOptions common;
  std::string action;
  std::string job;
  std::string registry = launcher::kJobRegistryDir;
  po::options_description desc("options");
  addCommonOptions(desc, &common, false);
  desc.add_options()("action", po::value<std::string>(&action), "cleanup")(
      "job", po::value<std::string>(&job), "the Slurm job that ended (default: $SLURM_JOB_ID)")(
      "registry", po::value<std::string>(&registry)->default_value(registry),
      "where node agents leave their jobs' claims");
  po::positional_options_description positional;
  positional.add("action", 1);
  po::variables_map vm;
  if (!parseCommandLine(inv, inv.args, desc, positional, "cleanup --job ID", &vm, &common)) return kExitOk;
  if (action != "cleanup") throw UsageError(action.empty() ? "missing action (cleanup)" : "unknown action " + action);
  if (job.empty()) {
    const char* env = std::getenv("SLURM_JOB_ID");
    if (env == nullptr || *env == '\0') throw UsageError("--job ID is required outside a Slurm epilog");
    job = env;
  }
  auto report = launcher::cleanUpSlurmJob(registry, job, launcher::currentHostName());
  if (!report.ok()) return reportError(inv, report.error());
  std::cout << "job " << job << ": " << report->directories << " node director"
            << (report->directories == 1 ? "y" : "ies") << ", " << report->sandboxes << " sandbox(es) and "
            << report->leftovers << " unrecorded cgroup(s) destroyed, " << report->mounts
            << " layer mount(s) released\n";
  for (const auto& note : report->notes) std::cout << "  " << note << "\n";
  return kExitOk;
}

}  // namespace dsec::cli
