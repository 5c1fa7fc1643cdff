#include <gtest/gtest.h>

#include "AptSources.h"
#include "dsec/common/Strings.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::fs3 {
namespace {

using ::dsec::testing::TempDir;

TEST(AptSourcesTest, FindsTheDebianMirrorInDeb822AndListFiles) {
  TempDir tmp;
  std::string etc = tmp.path();
  EXPECT_EQ(hostAptMirror(etc), "");
  ASSERT_OK(makeDirs(etc + "/sources.list.d"));
  // Like this machine: a disabled third-party list, then deb822 with the archive and the security archive.
  ASSERT_OK(writeFile(etc + "/sources.list.d/google.list.disabled", "deb https://packages.example.com/apt x main\n"));
  ASSERT_OK(writeFile(etc + "/sources.list.d/debian.sources",
                      "Types: deb\n# comment\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n"
                      "Components: main\n\nTypes: deb\nURIs: http://deb.debian.org/debian-security\n"
                      "Suites: bookworm-security\n"));
  EXPECT_EQ(hostAptMirror(etc), "http://deb.debian.org/debian");
  // A third-party repository sorted first does not win over the Debian archive.
  ASSERT_OK(writeFile(etc + "/sources.list.d/aaa.list",
                      "deb [signed-by=/k.gpg arch=amd64] https://apt.example.com/x y main\n"));
  EXPECT_EQ(hostAptMirror(etc), "http://deb.debian.org/debian");
  // The classic file comes first.
  ASSERT_OK(writeFile(etc + "/sources.list",
                      "# deb http://old.example.com/debian x main\ndeb-src http://src.example.org/debian b main\n"
                      "deb [arch=amd64] http://mirror.example.org/debian/ bookworm main\n"));
  EXPECT_EQ(hostAptMirror(etc), "http://mirror.example.org/debian/");
}

TEST(AptSourcesTest, SkipsDisabledStanzasAndFallsBackToAnyMirror) {
  TempDir tmp;
  std::string etc = tmp.path();
  ASSERT_OK(makeDirs(etc + "/sources.list.d"));
  ASSERT_OK(writeFile(etc + "/sources.list.d/a.sources",
                      "Types: deb\nURIs: http://off.example.org/debian\nSuites: x\nEnabled: no\n\n"
                      "Types: deb-src\nURIs: http://src.example.org/debian\nSuites: x\n\n"
                      "Types: deb\nURIs: cdrom:/media http://ftp.example.org/ubuntu\nSuites: y\n"));
  EXPECT_EQ(hostAptMirror(etc), "http://ftp.example.org/ubuntu");
}

}  // namespace
}  // namespace dsec::fs3
