/*
 * The file system of a local session's file: URIs: Hadoop's LocalFileSystem (checksums,
 * the same modes and umask), but the mode of each file and folder it creates is set by a
 * system call, not by a chmod process.
 *
 * Without Hadoop's native library, which PySpark does not ship, RawLocalFileSystem sets
 * the mode of every file, checksum file and folder it creates by running chmod: a process
 * started from the JVM, its task waiting for it. A 1M-line pipeline run started 283 of
 * them. Here java.nio sets the same mode; one it cannot express (a sticky, setuid or
 * setgid bit), or on a file system without POSIX modes, still goes to chmod.
 */
package ledge.pipeline;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public final class LocalFiles extends LocalFileSystem {
  public LocalFiles() {
    super(new Raw());
  }

  /** The mode bits java.nio sets: owner, group and others' read, write and execute. */
  static final int PLAIN = 0777;

  /** The permissions of a mode's PLAIN bits, as java.nio names them. */
  static Set<PosixFilePermission> permissions(int mode) {
    Set<PosixFilePermission> out = EnumSet.noneOf(PosixFilePermission.class);
    // OWNER_READ, OWNER_WRITE, OWNER_EXECUTE, GROUP_READ, ... OTHERS_EXECUTE: 0400 .. 0001
    PosixFilePermission[] all = PosixFilePermission.values();
    for (int i = 0; i < all.length; i++) {
      if ((mode & (0400 >> i)) != 0) {
        out.add(all[i]);
      }
    }
    return out;
  }

  static final class Raw extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      int mode = permission.toShort();
      if ((mode & ~PLAIN) != 0) {
        super.setPermission(p, permission);
        return;
      }
      try {
        Files.setPosixFilePermissions(pathToFile(p).toPath(), permissions(mode));
      } catch (UnsupportedOperationException notPosix) {
        super.setPermission(p, permission);
      }
    }
  }
}
