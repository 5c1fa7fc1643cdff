// Attack: one call reads what an earlier call on the same worker had. The victim call carries secrets in
// every part of its request and result — its code, its stdin, its files (names and contents), what it
// writes to /tmp, /dev/shm, its working directory and a POSIX message queue name, its stdout and stderr.
// The attacker's call runs next on the same worker (the node has one) and searches for them:
//  - its own address space: every readable region in /proc/self/maps, read through /proc/self/mem (made
//    readable with PR_SET_DUMPABLE; a call is a fork of the worker's zygote, so whatever the zygote's memory
//    ever held is there to read);
//  - the file system: every name under / (but /proc and /sys) and the contents of every file on a
//    writable mount, and every process's command line.
// It must find none. The attacker builds each needle byte by byte from a masked copy, so the secret exists
// in its memory exactly once, at an address it knows (and in its read buffer, whose range it knows). A
// canary it plants itself, in its memory and in a file, must be found: the search works.
#include <gtest/gtest.h>

#include <map>

#include "FncallNodeFixture.h"
#include "dsec/common/Base64.h"
#include "dsec/common/Strings.h"

namespace dsec::testing {
namespace {

using nlohmann::json;

constexpr int kMask = 0x5a;

std::string maskedHex(const std::string& secret) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : secret) {
    const unsigned v = c ^ kMask;
    out += kHex[v >> 4];
    out += kHex[v & 15];
  }
  return out;
}

// The attacker: prints "worker <hostname>", then one line per secret found ("FOUND <name> <where>"), then
// "scanned <bytes> <files>".
constexpr const char* kScanner = R"PY(
import ctypes, os, socket, sys
print('worker', socket.gethostname(), flush=True)
MASK = %MASK%
MASKED = %MASKED%
needles = {}
for name, masked in MASKED.items():
    raw = bytes.fromhex(masked)
    n = bytearray(len(raw))
    for i in range(len(raw)):
        n[i] = raw[i] ^ MASK
    needles[name] = n

def address(b):
    return ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b))

# The canary proves the search works: a copy of it in memory and in a file must be found.
planted = bytes(needles['canary'])
with open('/tmp/canary-file', 'wb') as f:
    f.write(planted)
buf = bytearray(1 << 20)
own = [(address(n), address(n) + len(n)) for n in needles.values()] + [(address(buf), address(buf) + len(buf))]
longest = max(len(n) for n in needles.values())
found = set()

def search(data, where):
    for name, n in needles.items():
        if data.find(n) >= 0:
            found.add((name, where))

scanned = 0
# A process that changed its uid is not dumpable, which closes /proc/self/mem to it; it may open it again.
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
mem = os.open('/proc/self/mem', os.O_RDONLY)
view = memoryview(buf)
with open('/proc/self/maps') as f:
    regions = f.read().splitlines()
for line in regions:
    fields = line.split()
    if fields[1][0] != 'r':
        continue
    lo, hi = (int(x, 16) for x in fields[0].split('-'))
    pos = lo
    while pos < hi:
        want = min(len(buf), hi - pos)
        try:
            got = os.preadv(mem, [view[:want]], pos)
        except OSError:
            pos += 4096
            continue
        if got <= 0:
            break
        for name, n in needles.items():
            i = buf.find(n, 0, got)
            while i >= 0:
                at = pos + i
                if not any(a <= at < b for a, b in own):
                    found.add((name, 'memory ' + (fields[5] if len(fields) > 5 else 'anonymous')))
                i = buf.find(n, i + 1, got)
        scanned += got
        pos += got if got < want or pos + got >= hi else got - (longest - 1)

writable = []
with open('/proc/self/mountinfo') as f:
    for line in f:
        fields = line.split()
        if 'rw' in fields[5].split(',') and not fields[4].startswith(('/proc', '/sys')):
            writable.append(fields[4])
files = 0
for top, dirs, names in os.walk('/'):
    if top == '/':
        dirs[:] = [d for d in dirs if d not in ('proc', 'sys')]
    for name in dirs + names:
        search(os.fsencode(name), 'file name ' + top)
    if not any(top == m or top.startswith(m.rstrip('/') + '/') for m in writable):
        continue
    for name in names:
        path = os.path.join(top, name)
        try:
            if not os.path.isfile(path) or os.path.islink(path):
                continue
            with open(path, 'rb') as f:
                data = f.read(64 << 20)
        except OSError:
            continue
        files += 1
        search(data, 'file ' + path)
for pid in os.listdir('/proc'):
    if pid.isdigit():
        for what in ('cmdline', 'environ'):
            try:
                with open('/proc/%s/%s' % (pid, what), 'rb') as f:
                    search(f.read(), what + ' of ' + pid)
            except OSError:
                pass
for name, where in sorted(found):
    print('FOUND', name, where)
print('scanned', scanned, files)
)PY";

TEST_F(FncallNodeAttack, LaterCallFindsNothingOfAnEarlierCall) {
  start();
  if (IsSkipped() || HasFatalFailure()) return;
  std::map<std::string, std::string> secrets;
  for (const char* part : {"code", "stdin", "file_data", "file_name", "tmp_name", "tmp_data", "shm_data", "cwd_data",
                           "mq_name", "stdout", "stderr", "canary"}) {
    secrets[part] = std::string("leak") + part + "x" + randomHex(16);
  }
  // Big parts too: large payloads take other paths through an allocator than small ones.
  const std::string filler(300000, '.');
  const std::string victim =
      "import ctypes, os, socket, sys\n"
      "print('worker', socket.gethostname())\n"
      "secret_in_code = '" +
      secrets["code"] +
      "'\n"
      "data = sys.stdin.read()\n"
      "assert '" +
      secrets["stdin"].substr(0, 8) +
      "' in data\n"
      "open('/tmp/" +
      secrets["tmp_name"] + "', 'w').write('" + secrets["tmp_data"] +
      "' * 1000)\n"
      "open('/dev/shm/keep', 'w').write('" +
      secrets["shm_data"] +
      "')\n"
      "open('mine.txt', 'w').write('" +
      secrets["cwd_data"] +
      "')\n"
      "libc = ctypes.CDLL(None)\n"
      "print('mq', libc.mq_open(b'/" +
      secrets["mq_name"] +
      "', 0o100 | 0o2, 0o600, None) >= 0)\n"
      "sys.stdout.write(('" +
      secrets["stdout"] +
      "' + '-' * 100) * 2000 + '\\n')\n"
      "sys.stderr.write('" +
      secrets["stderr"] + "' * 3 + '\\n')\n";
  json first =
      call({{"code", victim},
            {"stdin", filler + secrets["stdin"] + filler},
            {"files", {{"data/" + secrets["file_name"] + ".txt", base64Encode(filler + secrets["file_data"])}}},
            {"timeout", 60}});
  ASSERT_EQ(first["exit_code"], 0) << first.dump().substr(0, 2000);
  ASSERT_NE(first["stdout"].get<std::string>().find("mq True"), std::string::npos) << first["stdout"];

  std::string masked = "{";
  for (const auto& [name, secret] : secrets) masked += "'" + name + "': '" + maskedHex(secret) + "', ";
  masked += "}";
  std::string scanner = kScanner;
  scanner.replace(scanner.find("%MASK%"), 6, std::to_string(kMask));
  scanner.replace(scanner.find("%MASKED%"), 8, masked);
  for (const auto& [name, secret] : secrets) ASSERT_EQ(scanner.find(secret), std::string::npos);
  json second = call({{"code", scanner}, {"timeout", 300}, {"memory", "512M"}});
  const std::string out = second["stdout"].get<std::string>();
  ASSERT_EQ(second["exit_code"], 0) << second.dump();
  const std::string worker_line = "worker " + split(split(first["stdout"].get<std::string>(), '\n')[0], ' ').back();
  ASSERT_NE(out.find(worker_line + "\n"), std::string::npos)
      << "the attacker must run on the victim's worker: " << out.substr(0, 200);
  EXPECT_NE(out.find("FOUND canary memory"), std::string::npos) << "the search does not work:\n" << out;
  EXPECT_NE(out.find("FOUND canary file /tmp/canary-file"), std::string::npos) << "the search does not work:\n" << out;
  for (const auto& line : split(out, '\n')) {
    if (startsWith(line, "FOUND ") && !startsWith(line, "FOUND canary ")) {
      ADD_FAILURE() << "the attacker found the victim's data: " << line;
    }
  }
  EXPECT_NE(out.find("scanned "), std::string::npos) << out;
  std::printf("attacker's scan: %s", out.substr(out.find("scanned ")).c_str());
}

}  // namespace
}  // namespace dsec::testing
