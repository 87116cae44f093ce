// memory/file_io.h's durable writes: what is written where the path is a symbolic link,
// a device or a FIFO (the file a link names is replaced and the link kept; a device or a
// pipe takes the bytes and stays what it was, where renaming over it made it a file).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "memory/error.h"
#include "memory/file_io.h"

namespace baton::memory {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "-" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(FileIo, ASymbolicLinkKeepsPointingAtTheFileWritten) {
  const std::string dir = fresh_dir("file_io_link");
  fs::create_directories(dir + "/logs");
  std::ofstream(dir + "/logs/real.json") << "old";
  fs::create_symlink("logs/real.json", dir + "/link.json");
  write_file_durably(dir + "/link.json", "new");
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir + "/link.json")));
  EXPECT_EQ(read_file(dir + "/logs/real.json"), "new");
  EXPECT_EQ(read_file(dir + "/link.json"), "new");
}

TEST(FileIo, DevicesAndFifosTakeTheBytesAndStayWhatTheyWere) {
  write_file_durably("/dev/null", "discarded");
  struct stat st;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  // A FIFO with a reader: the reader gets the bytes, the FIFO stays one.
  const std::string fifo = fresh_dir("file_io_fifo") + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] { got = read_file(fifo); });
  write_file_durably(fifo, "through the pipe");
  reader.join();
  EXPECT_EQ(got, "through the pipe");
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // /dev/full refuses the bytes: an error, not a silent success.
  EXPECT_THROW(write_file_durably("/dev/full", std::string(1 << 16, 'x')), RuntimeError);
  ASSERT_EQ(::stat("/dev/full", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  // A directory is no file to write, nor to read (it had read as an empty file: "not
  // valid JSON: unexpected end of input" for a plan given as a folder).
  const std::string folder = fresh_dir("file_io_dir");
  EXPECT_THROW(write_file_durably(folder, "x"), InputError);
  try {
    read_file(folder);
    ADD_FAILURE() << "a directory read as a file";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), folder + ": a directory, expected a file");
  }
}

}  // namespace
}  // namespace baton::memory
