// Writing files without losing any (support/Files.h).
#include "support/Files.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <chrono>
#include <sys/stat.h>
#include <fmt/format.h>
#include <fstream>
#include <gtest/gtest.h>
#include <unistd.h>

using namespace tgc;

namespace {

std::string freshFolder() {
  llvm::SmallString<128> path;
  EXPECT_FALSE(llvm::sys::fs::createUniqueDirectory("tgc-files", path));
  return path.str().str();
}

std::string inFolder(const std::string &dir, const std::string &name) { return dir + "/" + name; }

std::string contentsOf(const std::string &path) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  return buffer ? (*buffer)->getBuffer().str() : "<unreadable>";
}

} // namespace

TEST(Files, AtomicWritesReplaceAndRemoveOnlyOldTemporaries) {
  std::string dir = freshFolder(), path = inFolder(dir, "ck.st");
  ASSERT_FALSE(bool(writeFileAtomically(path, "one")));
  // A temporary a killed save left an hour ago goes; one of a save running now stays.
  // (Both spellings: the short hidden one, and NAME.tmp-XXXXXX of earlier versions.)
  std::string stale = inFolder(dir, temporaryPrefix("ck.st") + "abcdef"), running = inFolder(dir, "ck.st.tmp-ghijkl"),
              staleOld = inFolder(dir, "ck.st.tmp-abcdef");
  std::ofstream(stale) << "half";
  std::ofstream(staleOld) << "half";
  std::ofstream(running) << "half";
  std::ofstream(inFolder(dir, "other.st.tmp-abcdef")) << "not ours";
  auto anHourAgo = llvm::sys::toTimePoint(std::time(nullptr) - 3600);
  for (const std::string &old : {stale, staleOld}) {
    int fd;
    ASSERT_FALSE(llvm::sys::fs::openFileForWrite(old, fd, llvm::sys::fs::CD_OpenExisting));
    ASSERT_FALSE(llvm::sys::fs::setLastAccessAndModificationTime(fd, anHourAgo));
    llvm::sys::fs::closeFile(fd);
  }
  ASSERT_FALSE(bool(writeFileAtomically(path, "two")));
  EXPECT_EQ(contentsOf(path), "two");
  EXPECT_FALSE(llvm::sys::fs::exists(stale));
  EXPECT_FALSE(llvm::sys::fs::exists(staleOld));
  EXPECT_TRUE(llvm::sys::fs::exists(running));
  EXPECT_TRUE(llvm::sys::fs::exists(inFolder(dir, "other.st.tmp-abcdef")));
  // A folder that is not there: an error naming the file, nothing written.
  auto err = writeFileAtomically(inFolder(dir, "missing/x.st"), "three");
  ASSERT_TRUE(bool(err));
  EXPECT_NE(llvm::toString(std::move(err)).find("missing/x.st: error:"), std::string::npos);
}

TEST(Files, ANameAtTheFoldersLimitIsWrittenAndOneBeyondItRefused) {
  std::string dir = freshFolder();
  long most = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  ASSERT_GT(most, 40);
  std::string longest = inFolder(dir, std::string(size_t(most), 'a'));
  EXPECT_FALSE(bool(checkNameFits(longest)));
  ASSERT_FALSE(bool(writeFileAtomically(longest, "fits"))); // its temporary's name is short
  EXPECT_EQ(contentsOf(longest), "fits");
  auto err = checkNameFits(longest, ".step-10");
  ASSERT_TRUE(bool(err));
  EXPECT_NE(llvm::toString(std::move(err)).find(fmt::format("the file name with '.step-10' is {} bytes, and its "
                                                            "folder takes names of at most {}", most + 8, most)),
            std::string::npos);
}

TEST(Files, AtomicWritesReplaceOnlyRegularFilesAndWriteThroughLinks) {
  std::string dir = freshFolder();
  // A pipe and a folder are refused and stay what they were (a device node, /dev/null, likewise:
  // making one needs root).
  std::string fifo = inFolder(dir, "pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string message = llvm::toString(writeFileAtomically(fifo, "data"));
  EXPECT_NE(message.find(fifo + ": error: exists and is not a regular file"), std::string::npos) << message;
  llvm::sys::fs::file_status status;
  ASSERT_FALSE(llvm::sys::fs::status(fifo, status));
  EXPECT_EQ(status.type(), llvm::sys::fs::file_type::fifo_file);
  std::string folder = inFolder(dir, "folder");
  ASSERT_FALSE(llvm::sys::fs::create_directory(folder));
  message = llvm::toString(writeFileAtomically(folder, "data"));
  EXPECT_NE(message.find("is not a regular file"), std::string::npos) << message;
  ASSERT_FALSE(llvm::sys::fs::status(folder, status));
  EXPECT_EQ(status.type(), llvm::sys::fs::file_type::directory_file);
  // A link: the file it names gets the new contents, the link stays a link.
  std::string target = inFolder(dir, "target"), link = inFolder(dir, "link");
  ASSERT_FALSE(bool(writeFileAtomically(target, "old")));
  ASSERT_FALSE(llvm::sys::fs::create_link("target", link));
  ASSERT_FALSE(bool(writeFileAtomically(link, "new")));
  EXPECT_EQ(contentsOf(target), "new");
  ASSERT_FALSE(llvm::sys::fs::status(link, status, /*Follow=*/false));
  EXPECT_EQ(status.type(), llvm::sys::fs::file_type::symlink_file);
  // A link to nothing is refused and left alone.
  std::string dangling = inFolder(dir, "dangling");
  ASSERT_FALSE(llvm::sys::fs::create_link("missing", dangling));
  message = llvm::toString(writeFileAtomically(dangling, "data"));
  EXPECT_NE(message.find("a link to nothing"), std::string::npos) << message;
  EXPECT_FALSE(llvm::sys::fs::exists(inFolder(dir, "missing")));
  llvm::sys::fs::remove_directories(dir);
}

TEST(Files, TheSameFileUnderTwoFlagsIsFoundByInodeOrResolvedPath) {
  std::string dir = freshFolder(), model = inFolder(dir, "m.yaml"), link = inFolder(dir, "link.yaml");
  std::ofstream(model) << "name: m\n";
  ASSERT_FALSE(llvm::sys::fs::create_link("m.yaml", link));
  auto errorOf = [](llvm::Error err) { return err ? llvm::toString(std::move(err)) : std::string(); };
  std::string m = errorOf(checkDistinctFiles({{"the model file", model}, {"--log", link}}));
  EXPECT_NE(m.find("the model file and --log name the same file"), std::string::npos) << m;
  // Outputs not there yet: by folder and name, whatever the spelling.
  m = errorOf(checkDistinctFiles({{"--save", inFolder(dir, "a.st")}, {"--log", dir + "/./x/../a.st"}}));
  EXPECT_TRUE(m.empty()) << m; // x does not exist: another folder as far as anyone can say
  m = errorOf(checkDistinctFiles({{"--save", inFolder(dir, "a.st")}, {"--log", dir + "/../" +
                                                                                llvm::sys::path::filename(dir).str() +
                                                                                "/a.st"}}));
  EXPECT_NE(m.find("--save and --log name the same file"), std::string::npos) << m;
  // Different files, absent flags and allowed pairs pass.
  EXPECT_TRUE(errorOf(checkDistinctFiles({{"the model file", model}, {"--data", ""}, {"--log", ""}})).empty());
  EXPECT_TRUE(errorOf(checkDistinctFiles({{"--resume", model}, {"--save", link}}, {{"--resume", "--save"}})).empty());
}
