package simhttp

import (
	"fmt"
	"net/http"
	"slices"
	"sync"

	"github.com/gin-gonic/gin"
)

// LoRA is one LoRA adapter, served as an extra model (--lora-modules).
type LoRA struct {
	Name, Path, Base string
	// ID is vLLM's lora_int_id: 1-based, in load order, never reused (a
	// reload gets a new one). KV events carry it as the deprecated lora_id.
	ID int64
}

// adapters is the set of adapters a server serves: the --lora-modules
// ones, then those loaded at run time, in load order (vLLM's
// OpenAIServingModels.lora_requests). Safe for concurrent use.
type adapters struct {
	mu   sync.RWMutex
	list []LoRA
	last int64 // the last id given out
}

func newAdapters(static []LoRA) *adapters {
	a := &adapters{}
	a.reset(static)
	return a
}

// reset leaves only the static adapters, numbered from 1, as a new vLLM
// process starts.
func (a *adapters) reset(static []LoRA) {
	a.mu.Lock()
	a.list, a.last = nil, 0
	a.mu.Unlock()
	for _, l := range static {
		a.add(l, false)
	}
}

// add registers l under a new id. An existing name is an error unless
// inplace, which replaces it where it stands.
func (a *adapters) add(l LoRA, inplace bool) *apiError {
	a.mu.Lock()
	defer a.mu.Unlock()
	i := slices.IndexFunc(a.list, func(x LoRA) bool { return x.Name == l.Name })
	if i >= 0 && !inplace {
		return &apiError{Status: 400, Type: "InvalidUserInput", Message: fmt.Sprintf(
			"The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", l.Name)}
	}
	a.last++
	l.ID = a.last
	if i >= 0 {
		a.list[i] = l
	} else {
		a.list = append(a.list, l)
	}
	return nil
}

func (a *adapters) remove(name string) *apiError {
	a.mu.Lock()
	defer a.mu.Unlock()
	i := slices.IndexFunc(a.list, func(x LoRA) bool { return x.Name == name })
	if i < 0 {
		return notFound("The lora adapter '%s' cannot be found.", name)
	}
	a.list = slices.Delete(a.list, i, i+1)
	return nil
}

func (a *adapters) find(name string) (LoRA, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	i := slices.IndexFunc(a.list, func(x LoRA) bool { return x.Name == name })
	if i < 0 {
		return LoRA{}, false
	}
	return a.list[i], true
}

func (a *adapters) all() []LoRA {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return slices.Clone(a.list)
}

// loadLoRA is vLLM's POST /v1/load_lora_adapter (served only with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING). The simulator has no weights to read,
// so any path loads; vLLM's "No adapter found" 404 for a bad path is not
// simulated. A missing field reads as empty, which vLLM's own check
// answers with the same 400 its schema validation would.
func (s *Server) loadLoRA(c *gin.Context) {
	var r struct {
		Name    string `json:"lora_name"`
		Path    string `json:"lora_path"`
		Inplace bool   `json:"load_inplace"`
	}
	if !bindJSON(c, &r) {
		return
	}
	if r.Name == "" || r.Path == "" {
		writeError(c, &apiError{Status: 400, Type: "InvalidUserInput", Message: "Both 'lora_name' and 'lora_path' must be provided."})
		return
	}
	if aerr := s.loras.add(LoRA{Name: r.Name, Path: r.Path}, r.Inplace); aerr != nil {
		writeError(c, aerr)
		return
	}
	c.String(http.StatusOK, "Success: LoRA adapter '%s' added successfully.", r.Name)
}

// unloadLoRA is vLLM's POST /v1/unload_lora_adapter. The adapter's cached
// blocks stay until evicted, as in vLLM: their hashes carry its name, so
// only a reload under the same name can hit them again.
func (s *Server) unloadLoRA(c *gin.Context) {
	var r struct {
		Name string `json:"lora_name"`
		ID   *int64 `json:"lora_int_id"`
	}
	if !bindJSON(c, &r) {
		return
	}
	if r.Name == "" {
		writeError(c, &apiError{Status: 400, Type: "InvalidUserInput", Message: "'lora_name' needs to be provided to unload a LoRA adapter."})
		return
	}
	if aerr := s.loras.remove(r.Name); aerr != nil {
		writeError(c, aerr)
		return
	}
	c.String(http.StatusOK, "Success: LoRA adapter '%s' removed successfully.", r.Name)
}
