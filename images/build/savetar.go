package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// imageConfig is the "config" object of an OCI/Docker image config.
type imageConfig struct {
	User         string              `json:"User,omitempty"`
	Env          []string            `json:"Env,omitempty"`
	Entrypoint   []string            `json:"Entrypoint,omitempty"`
	Cmd          []string            `json:"Cmd,omitempty"`
	WorkingDir   string              `json:"WorkingDir,omitempty"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts,omitempty"`
	Labels       map[string]string   `json:"Labels,omitempty"`
}

// skipContents are directories whose contents belong to the runtime, not
// the image: the container runtime mounts them.
var skipContents = map[string]bool{"proc": true, "sys": true, "dev": true}

// writeLayer writes root as one uncompressed layer tar and returns the
// sha256 of its bytes (the layer's diff_id). Owners, modes, symlinks and
// hard links are kept; times are fixed so that equal trees give equal
// layers.
func writeLayer(w io.Writer, root string, mtime time.Time) (string, error) {
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(w, h))
	links := map[uint64]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if top, _, nested := strings.Cut(rel, "/"); nested && skipContents[top] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var target string
		if info.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		if info.Mode()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0 {
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, target)
		if err != nil {
			return err
		}
		hdr.Name = rel
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Format = tar.FormatPAX
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = mtime, time.Time{}, time.Time{}
		hdr.Uname, hdr.Gname = "", ""
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
			if info.Mode().IsRegular() && st.Nlink > 1 {
				if first, seen := links[st.Ino]; seen {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				} else {
					links[st.Ino] = rel
				}
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// writeSave writes a `docker save` archive (manifest.json, the config
// blob named by its digest, one layer) that both `docker load` and
// `ctr images import` read.
func writeSave(out, root, tag string, cfg imageConfig, created time.Time) (digest string, err error) {
	layer, err := os.CreateTemp(filepath.Dir(out), ".layer-*.tar")
	if err != nil {
		return "", err
	}
	defer os.Remove(layer.Name())
	defer layer.Close()
	diffID, err := writeLayer(layer, root, created)
	if err != nil {
		return "", err
	}
	size, err := layer.Seek(0, io.SeekCurrent)
	if err != nil {
		return "", err
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      created.UTC().Format(time.RFC3339),
		"config":       cfg,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"history":      []map[string]string{{"created": created.UTC().Format(time.RFC3339), "created_by": "kvroute images/build"}},
	})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(config)
	id := hex.EncodeToString(sum[:])
	layerDir := strings.TrimPrefix(diffID, "sha256:")
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   id + ".json",
		"RepoTags": []string{tag},
		"Layers":   []string{layerDir + "/layer.tar"},
	}})
	if err != nil {
		return "", err
	}
	repo, ref := splitTag(tag)
	repositories, err := json.Marshal(map[string]map[string]string{repo: {ref: layerDir}})
	if err != nil {
		return "", err
	}

	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp)
	defer f.Close()
	tw := tar.NewWriter(f)
	file := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: created}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: layerDir + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: created}); err != nil {
		return "", err
	}
	if err := file(layerDir+"/VERSION", []byte("1.0")); err != nil {
		return "", err
	}
	if err := tw.WriteHeader(&tar.Header{Name: layerDir + "/layer.tar", Mode: 0o644, Size: size, ModTime: created}); err != nil {
		return "", err
	}
	if _, err := io.Copy(tw, layer); err != nil {
		return "", err
	}
	for _, e := range []struct {
		name string
		data []byte
	}{{id + ".json", config}, {"manifest.json", manifest}, {"repositories", repositories}} {
		if err := file(e.name, e.data); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return "sha256:" + id, os.Rename(tmp, out)
}

// splitTag splits "host/repo:tag" at the tag's colon, not a port's.
func splitTag(tag string) (repo, ref string) {
	i := strings.LastIndex(tag, ":")
	if i < 0 || strings.Contains(tag[i:], "/") {
		return tag, "latest"
	}
	return tag[:i], tag[i+1:]
}

func sortedPorts(ports map[string]struct{}) []string {
	var s []string
	for p := range ports {
		s = append(s, p)
	}
	sort.Strings(s)
	return s
}

func (c imageConfig) String() string {
	return fmt.Sprintf("entrypoint %q user %q ports %v", c.Entrypoint, c.User, sortedPorts(c.ExposedPorts))
}
