// memory/file_io.h's durable writes: what is written where the path is a symbolic link,
// a device or a FIFO (the file a link names is replaced and the link kept; a device or a
// pipe takes the bytes and stays what it was, where renaming over it made it a file); and
// its readers of regular files, which refuse a FIFO rather than wait on it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

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

// What a stop signal would leave half-written is removed while registered, a tree whole and
// a directory the command made only when empty; nothing once the registration ends.
TEST(FileIo, RemoveOnStopRemovesWhatIsRegisteredWhileItIs) {
  const std::string d = fresh_dir("remove-on-stop");
  fs::create_directories(d + "/out/.staging/sub");
  std::ofstream(d + "/out/.staging/sub/f") << "x";
  std::ofstream(d + "/keep.tmp") << "x";
  { const RemoveOnStop kept({d + "/keep.tmp"}); }
  fs::create_directories(d + "/full");
  std::ofstream(d + "/full/other") << "x";
  std::vector<std::string> removed;
  {
    const RemoveOnStop on_stop({d + "/out/.staging", d + "/missing"}, {d + "/out", d + "/full"});
    removed = remove_on_stop();
  }
  EXPECT_EQ(removed, (std::vector<std::string>{d + "/out/.staging", d + "/out"}));
  EXPECT_FALSE(fs::exists(d + "/out"));
  EXPECT_TRUE(fs::exists(d + "/full/other"));  // not empty: not the command's to remove
  EXPECT_TRUE(fs::exists(d + "/keep.tmp"));    // its registration had ended
  EXPECT_TRUE(remove_on_stop().empty());
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

TEST(FileIo, ADanglingLinkGetsItsTargetWrittenAndALoopIsRefused) {
  const std::string dir = fresh_dir("file_io_dangling");
  fs::create_directories(dir + "/target");
  fs::create_symlink("target/sum.json", dir + "/sum.json");
  // A chain: link2 -> sum.json -> target/sum.json (none of which exists yet).
  fs::create_symlink("sum.json", dir + "/link2.json");
  write_file_durably(dir + "/link2.json", "new");
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir + "/sum.json")));
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir + "/link2.json")));
  EXPECT_EQ(read_file(dir + "/target/sum.json"), "new");
  EXPECT_EQ(resolve_links(dir + "/link2.json"), dir + "/target/sum.json");
  fs::create_symlink("b", dir + "/a");
  fs::create_symlink("a", dir + "/b");
  try {
    write_file_durably(dir + "/a", "x");
    ADD_FAILURE() << "a symbolic link loop was written";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/a: symbolic link loop"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir + "/a")));
}

TEST(FileIo, ADescriptorPathIsWrittenThroughTheDescriptorNotReplaced) {
  // `-o /dev/stdout >> app.log`: the bytes follow what is there; the file is not renamed
  // over (which had lost the earlier lines and everything written after).
  const std::string log = fresh_dir("file_io_fd") + "/app.log";
  std::ofstream(log) << "EARLIER\n";
  const int fd = ::open(log.c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  struct stat before;
  ASSERT_EQ(::stat(log.c_str(), &before), 0);
  for (const std::string& path :
       {"/dev/fd/" + std::to_string(fd), "/proc/self/fd/" + std::to_string(fd)})
    write_file_durably(path, "line\n");
  ASSERT_EQ(::write(fd, "after\n", 6), 6);
  ::close(fd);
  EXPECT_EQ(read_file(log), "EARLIER\nline\nline\nafter\n");
  struct stat after;
  ASSERT_EQ(::stat(log.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  // A descriptor that is not open is no output.
  EXPECT_THROW(write_file_durably("/dev/fd/" + std::to_string(fd), "x"), InputError);
}

TEST(FileIo, ALongNameGetsAShortTemporaryName) {
  // A legal name of 250 bytes: name + ".tmp<pid>.<n>" passed NAME_MAX ("File name too
  // long" after all the work).
  const std::string dir = fresh_dir("file_io_long");
  const std::string path = dir + "/" + std::string(250, 's');
  write_file_durably(path, "long");
  EXPECT_EQ(read_file(path), "long");
  EXPECT_EQ(temp_path_beside(dir + "/short.json", ".tmp"), dir + "/short.json.tmp");
  const std::string tmp = temp_path_beside(path, ".tmp");
  EXPECT_EQ(fs::path(tmp).parent_path().string(), dir);
  EXPECT_LE(fs::path(tmp).filename().string().size(), size_t(NAME_MAX));
  EXPECT_EQ(tmp, temp_path_beside(path, ".tmp"));
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(dir)) left += e.path() != path;
  EXPECT_EQ(left, 0u);
}

// A path of 4090 bytes, legal, whose temporary name as a whole path passes PATH_MAX: the
// temporary file is made and renamed relative to its directory.
TEST(FileIo, APathNearPathMaxIsWritten) {
  std::string dir = fresh_dir("file_io_path_max");
  while (dir.size() + 201 < 4039) {
    dir += "/" + std::string(200, 'd');
    fs::create_directory(dir);
  }
  const std::string path = dir + "/" + std::string(4090 - dir.size() - 1, 'y');
  ASSERT_EQ(path.size(), 4090u);
  write_file_durably(path, "deep");
  EXPECT_EQ(read_file(path), "deep");
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(dir)) left += e.path() != path;
  EXPECT_EQ(left, 0u);
}

// A file replaced keeps its mode, as cp and the shell's > leave it; a new one gets 0666
// less the umask (every file had been 0644: a private one became world-readable).
TEST(FileIo, AReplacedFileKeepsItsModeAndANewOneFollowsTheUmask) {
  const std::string dir = fresh_dir("file_io_mode");
  const std::string kept = dir + "/private.json", fresh = dir + "/new.json";
  write_file_durably(kept, "old");
  ASSERT_EQ(::chmod(kept.c_str(), 0600), 0);
  write_file_durably(kept, "new");
  struct stat st;
  ASSERT_EQ(::stat(kept.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(read_file(kept), "new");
  const mode_t before = ::umask(002);
  write_file_durably(fresh, "x");
  ::umask(before);
  ASSERT_EQ(::stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0664u);
}

TEST(FileIo, AFailureOfTheDiskAtRunTimeIsARuntimeError) {
  // No space at write time: a failure of the run (exit 1), which --max-restarts may retry,
  // not bad input; the message names the output.
  const std::string dir = fresh_dir("file_io_full");
  fs::create_symlink("/dev/full", dir + "/out.json");
  try {
    write_file_durably(dir + "/out.json", std::string(1 << 16, 'x'));
    ADD_FAILURE() << "/dev/full took the bytes";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/out.json: write error"), std::string::npos)
        << e.what();
  }
  // Creating the file fails for the state of the system (here: no descriptor left; no
  // inodes or no space on a full disk): a RuntimeError too, where it had been InputError.
  int lowest = ::dup(0);
  ASSERT_GE(lowest, 0);
  ::close(lowest);
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit low = saved;
  low.rlim_cur = rlim_t(lowest);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::string error;
  bool runtime = false;
  try {
    write_file_durably(dir + "/real.json", "x");
  } catch (const RuntimeError& e) {
    runtime = true;
    error = e.what();
  } catch (const std::exception& e) {
    error = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_TRUE(runtime) << error;
  EXPECT_EQ(error.rfind(dir + "/real.json (temporary file ", 0), 0u) << error;
  EXPECT_FALSE(fs::exists(dir + "/real.json"));
  // What the user named stays bad input: a folder that does not exist.
  EXPECT_THROW(write_file_durably(dir + "/no/such/dir.json", "x"), InputError);
}

}  // namespace
}  // namespace baton::memory
