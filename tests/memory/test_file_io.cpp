// memory/file_io.h's durable writes: what is written where the path is a symbolic link,
// a device or a FIFO (the file a link names is replaced and the link kept; a device or a
// pipe takes the bytes and stays what it was, where renaming over it made it a file); and
// its readers of regular files, which refuse a FIFO rather than wait on it.
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
#include "tests/fifo_read.h"

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

// What baton finds inside a directory it was given must be a regular file: a FIFO is
// refused at once, naming it (reading one had waited for ever for a writer), while
// read_file still reads a pipe named on the command line (`--model <(...)`).
TEST(FileIo, RegularFileReadersRefuseAFifoWithoutWaiting) {
  const std::string dir = fresh_dir("file_io_regular");
  const std::string fifo = dir + "/manifest.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string refused = fifo + ": cannot open file (not a regular file: a FIFO)";
  EXPECT_EQ(testing_support::input_error_reading_fifo(fifo, [&] { read_regular_file(fifo); }),
            refused);
  EXPECT_EQ(
      testing_support::input_error_reading_fifo(fifo, [&] { ::close(open_regular_file(fifo)); }),
      refused);
  EXPECT_EQ(testing_support::input_error_reading_fifo(fifo, [&] { check_regular_file(fifo); }),
            refused);
  try {
    read_regular_file(dir);
    ADD_FAILURE() << "a directory read as a file";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), dir + ": cannot open file (not a regular file: a directory)");
  }
  try {
    read_regular_file(dir + "/none.json");
    ADD_FAILURE() << "a missing file read";
  } catch (const InputError& e) {
    EXPECT_NE(
        std::string(e.what()).find(dir + "/none.json: cannot open file (missing or unreadable)"),
        std::string::npos)
        << e.what();
  }
  check_regular_file(dir + "/none.json");  // missing: the caller's to say
  std::ofstream(dir + "/plain.json") << "{\"a\": 1}";
  EXPECT_EQ(read_regular_file(dir + "/plain.json"), "{\"a\": 1}");
  // A pipe named on the command line is still read.
  std::string got;
  std::thread reader([&] { got = read_file(fifo); });
  write_file_durably(fifo, "from a pipe");
  reader.join();
  EXPECT_EQ(got, "from a pipe");
}

}  // namespace
}  // namespace baton::memory
