package migrations

import (
	"bytes"
	"io"
	"io/fs"
	"slices"
	"strings"
	"time"
)

// filledFS is a flat, read-only, in-memory file system of migration files,
// keyed by file name: what [Files] returns.
type filledFS map[string][]byte

var (
	_ fs.ReadDirFS  = filledFS(nil)
	_ fs.ReadFileFS = filledFS(nil)
)

// Open opens the file name, or the root directory ".".
func (f filledFS) Open(name string) (fs.File, error) {
	if name == "." {
		entries, _ := f.ReadDir(".")
		return &dirFile{entries: entries}, nil
	}
	body, ok := f[name]
	if !ok || !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return &file{info: fileInfo{name: name, size: int64(len(body))}, Reader: bytes.NewReader(body)}, nil
}

// ReadFile returns a copy of the file name.
func (f filledFS) ReadFile(name string) ([]byte, error) {
	body, ok := f[name]
	if !ok || !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrNotExist}
	}
	return bytes.Clone(body), nil
}

// ReadDir lists the root directory, sorted by name.
func (f filledFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if name != "." {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	entries := make([]fs.DirEntry, 0, len(f))
	for name, body := range f {
		entries = append(entries, fs.FileInfoToDirEntry(fileInfo{name: name, size: int64(len(body))}))
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, nil
}

type file struct {
	*bytes.Reader
	info fileInfo
}

func (f *file) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *file) Close() error               { return nil }

type dirFile struct {
	entries []fs.DirEntry
	read    int
}

func (d *dirFile) Stat() (fs.FileInfo, error) { return fileInfo{name: ".", dir: true}, nil }
func (d *dirFile) Close() error               { return nil }
func (d *dirFile) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: ".", Err: fs.ErrInvalid}
}

// ReadDir returns the next n entries (all remaining ones when n <= 0).
func (d *dirFile) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := d.entries[d.read:]
	if n <= 0 {
		d.read = len(d.entries)
		return rest, nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	rest = rest[:min(n, len(rest))]
	d.read += len(rest)
	return rest, nil
}

type fileInfo struct {
	name string
	size int64
	dir  bool
}

func (i fileInfo) Name() string { return i.name }
func (i fileInfo) Size() int64  { return i.size }
func (i fileInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}
func (i fileInfo) ModTime() time.Time { return time.Time{} }
func (i fileInfo) IsDir() bool        { return i.dir }
func (i fileInfo) Sys() any           { return nil }
