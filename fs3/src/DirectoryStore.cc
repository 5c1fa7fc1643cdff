#include <unistd.h>

#include "dsec/common/Strings.h"
#include "dsec/fs3/Prefetch.h"
#include "dsec/fs3/SharedStore.h"
#include "dsec/fs3/StoreMaintenance.h"

namespace dsec::fs3 {

bool DirectoryStore::has(const LayerRef& ref) {
  return validateLayerRef(ref).ok() && ::access(store_.manifestPath(ref).c_str(), F_OK) == 0;
}

Result<std::string> DirectoryStore::recording(const LayerRef& ref) {
  DSEC_TRY(validateLayerRef(ref));
  auto text = readFile(storeRecordingPath(store_, ref));
  if (!text.ok() && text.error().sysErrno() == ENOENT) return Error::notFound("no recording");
  return text;
}

Status DirectoryStore::putRecording(const LayerRef& ref, const std::string& text) {
  DSEC_TRY(validateLayerRef(ref));
  const std::string path = storeRecordingPath(store_, ref);
  DSEC_TRY(makeDirs(path.substr(0, path.rfind('/'))));
  return writeFileAtomic(path, text, 0644);
}

Status DirectoryStore::renewLease(const std::set<LayerRef>& in_use) { return writeLease(store_, in_use); }

void DirectoryStore::dropLease() { removeLease(store_); }

}  // namespace dsec::fs3
