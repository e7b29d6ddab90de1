package simhttp

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/vllmsim"
)

// imageChat is a chat whose user message holds an image after a long
// system prompt; part is the image's content part.
func imageChat(part string) string {
	return fmt.Sprintf(`[{"role":"system","content":%q},{"role":"user","content":[{"type":"text","text":"what is this?"},%s]}]`, longPrompt, part)
}

const (
	dataURLA = "data:image/png;base64,iVBORw0KGgoAAAA"
	dataURLB = "data:image/png;base64,R0lGODlhAQABAAAA"
)

func imagePart(url, uuid string) string {
	if uuid != "" {
		return fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q},"uuid":%q}`, url, uuid)
	}
	return fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q}}`, url)
}

// An image in a chat is rendered as the tokenizer renders images, named by
// its content hash (or its uuid), placed on the engine request: /tokenize
// and generation give the same ids, blocks over the image carry its id in
// their extra keys, and a different image shares only the blocks before
// the image's first.
func TestChatImages(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) { c.ScaleOut = true })
	chat := func(msgs string) (chatResponse, []byte) {
		t.Helper()
		code, b := env.do(t, "POST", "/v1/chat/completions", `{"messages":`+msgs+`,"max_tokens":2,"return_token_ids":true}`)
		if code != 200 {
			t.Fatalf("chat: %d %s", code, b)
		}
		var r chatResponse
		mustJSON(t, b, &r)
		return r, b
	}
	msgsA := imageChat(imagePart(dataURLA, ""))
	ids := tokenized(t, env, `{"messages":`+msgsA+`}`)
	if n := countOf(ids, vllmsim.TokenImagePad); n != vllmsim.DefaultImageTokens {
		t.Fatalf("/tokenize has %d image pad tokens; want %d", n, vllmsim.DefaultImageTokens)
	}
	plain := tokenized(t, env, fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":"what is this?"}]}`, longPrompt))
	if cmp.Equal(ids, plain) {
		t.Fatal("/tokenize ignores the image")
	}
	first, _ := chat(msgsA)
	if !cmp.Equal(first.PromptTokenIDs, ids) {
		t.Errorf("generation's prompt_token_ids differ from /tokenize's")
	}

	// The render features name the image and its placeholders.
	code, b := env.do(t, "POST", "/v1/chat/completions/render", `{"messages":`+msgsA+`}`)
	var raw struct {
		TokenIDs []uint32 `json:"token_ids"`
		Features struct {
			MMHashes       map[string][]string        `json:"mm_hashes"`
			MMPlaceholders map[string][]mmPlaceholder `json:"mm_placeholders"`
			KwargsData     json.RawMessage            `json:"kwargs_data"`
		} `json:"features"`
	}
	mustJSON(t, b, &raw)
	idA := vllmsim.ContentID(dataURLA)
	ph := raw.Features.MMPlaceholders["image"]
	if code != 200 || !cmp.Equal(raw.TokenIDs, ids) || !cmp.Equal(raw.Features.MMHashes, map[string][]string{"image": {idA}}) ||
		len(ph) != 1 || ph[0].Length != vllmsim.DefaultImageTokens || string(raw.Features.KwargsData) != "null" {
		t.Fatalf("render = %d %s", code, b)
	}
	offset := ph[0].Offset
	if ids[offset] != vllmsim.TokenImagePad || ids[offset-1] != vllmsim.TokenVisionStart {
		t.Errorf("placeholder offset %d is not the first pad token", offset)
	}

	// Blocks overlapping the image carry its id.
	var cache struct {
		Blocks []cachedBlockJSON `json:"blocks"`
	}
	_, b = env.do(t, "GET", "/sim/cache", "")
	mustJSON(t, b, &cache)
	withImage := 0
	for _, bl := range cache.Blocks {
		if slices.Contains(bl.Extra, idA) {
			withImage++
		}
	}
	if withImage == 0 {
		t.Errorf("no cached block carries the image id %s: %s", idA, b)
	}

	// The same text with another image hits only the blocks before the
	// image's first block; the first image again hits all it can.
	other, _ := chat(imageChat(imagePart(dataURLB, "")))
	if got, want := other.Usage.PromptTokensDetails.CachedTokens, offset/16*16; got != want {
		t.Errorf("another image: cached_tokens %d; want the %d tokens before the image's block", got, want)
	}
	again, _ := chat(msgsA)
	if got, want := again.Usage.PromptTokensDetails.CachedTokens, (len(ids)-1)/16*16; got != want {
		t.Errorf("the same image again: cached_tokens %d; want %d", got, want)
	}

	// A uuid names the image instead of its content: the same uuid on
	// another URL hits, as vLLM's multi_modal_uuids do.
	chat(imageChat(imagePart(dataURLA, "img-1")))
	byUUID, _ := chat(imageChat(imagePart(dataURLB, "img-1")))
	if got, want := byUUID.Usage.PromptTokensDetails.CachedTokens, (len(ids)-1)/16*16; got != want {
		t.Errorf("same uuid, other URL: cached_tokens %d; want %d", got, want)
	}
}

func countOf(ids []uint32, id uint32) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}

// Image parts take the forms vLLM's chat parser reads.
func TestMessageContentImages(t *testing.T) {
	for _, tt := range []struct {
		name, raw string
		want      []part
		wantErr   bool
	}{
		{"url object", `[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x/1.png"}}]`,
			[]part{{text: "a"}, {image: true, url: "http://x/1.png"}}, false},
		{"bare string", `[{"type":"image_url","image_url":"http://x/1.png","uuid":"u"}]`,
			[]part{{image: true, url: "http://x/1.png", uuid: "u"}}, false},
		{"responses input_image", `[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"data:image/png;base64,AA"}]`,
			[]part{{text: "a"}, {image: true, url: "data:image/png;base64,AA"}}, false},
		{"no url", `[{"type":"image_url"}]`, nil, true},
		{"empty url", `[{"type":"image_url","image_url":{"url":""}}]`, nil, true},
		{"url not a string", `[{"type":"image_url","image_url":{"url":5}}]`, nil, true},
		{"audio", `[{"type":"input_audio","input_audio":{}}]`, nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			text, got, err := messageContent(json.RawMessage(tt.raw))
			if (err != nil) != tt.wantErr {
				t.Fatalf("messageContent(%s) error %v; want error %v", tt.raw, err, tt.wantErr)
			}
			if err == nil && (text != "" || !cmp.Equal(got, tt.want, cmp.AllowUnexported(part{}))) {
				t.Errorf("messageContent(%s) = %q %+v; want %+v", tt.raw, text, got, tt.want)
			}
		})
	}
	// Text parts only stay one string, output_text and input_text too.
	if text, parts, err := messageContent(json.RawMessage(`[{"type":"input_text","text":"a"},{"type":"output_text","text":"b"}]`)); err != nil || parts != nil || text != "a\nb" {
		t.Errorf("text parts = %q %v %v; want \"a\\nb\"", text, parts, err)
	}
}

// FuzzMessageContent: content parsing never panics; what it accepts as
// text is encoding/json's reading of a string, and every image it accepts
// has a URL.
func FuzzMessageContent(f *testing.F) {
	for _, s := range []string{`"hi"`, `null`, `[{"type":"text","text":"a"}]`, `[{"type":"image_url","image_url":{"url":"u"},"uuid":"x"}]`,
		`[{"type":"image_url","image_url":"u"}]`, `[{"type":"input_image","image_url":"u"}]`, `[{"type":"image_url","image_url":{}}]`,
		`[{"type":"text"}]`, `{}`, `[1]`, `"\u00e9\n"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		text, parts, err := messageContent(b)
		if err != nil {
			return
		}
		for _, p := range parts {
			if p.image && p.url == "" {
				t.Fatalf("messageContent(%q) accepted an image without a URL", b)
			}
		}
		if parts != nil && text != "" {
			t.Fatalf("messageContent(%q) returned both text and parts", b)
		}
	})
}

// Images in Messages and Responses are chat image_url parts after the
// conversion: the same tokens and placements as the chat, the same
// content id (so a chat request with that image hits their blocks).
func TestImagesInMessagesAndResponses(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) { c.ScaleOut = true })
	url := "data:image/png;base64,AAAA"
	chat := fmt.Sprintf(`[{"role":"user","content":[{"type":"text","text":%q},{"type":"image_url","image_url":{"url":%q}}]}]`, longPrompt, url)
	want := tokenized(t, env, `{"messages":`+chat+`}`)
	for _, tt := range []struct{ path, body string }{
		{"/v1/chat/completions/render", `{"messages":` + chat + `}`},
		{"/v1/messages/render", fmt.Sprintf(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":[{"type":"text","text":%q},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}`, longPrompt)},
		{"/v1/responses/render", fmt.Sprintf(`{"input":[{"role":"user","content":[{"type":"input_text","text":%q},{"type":"input_image","image_url":%q}]}]}`, longPrompt, url)},
	} {
		code, b := env.do(t, "POST", tt.path, tt.body)
		var g generateRequest
		mustJSON(t, b, &g)
		if code != 200 || !cmp.Equal(g.TokenIDs, want) || g.Features == nil || !cmp.Equal(g.Features.MMHashes["image"], []string{vllmsim.ContentID(url)}) {
			t.Errorf("%s = %d %s; want the chat's tokens and image", tt.path, code, b)
		}
	}
	// Served, the Messages request leaves blocks a chat with the image hits.
	if code, b := env.do(t, "POST", "/v1/messages", fmt.Sprintf(`{"model":"sim-model","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":%q},{"type":"image","source":{"type":"url","url":%q}}]}]}`, longPrompt, url)); code != 200 {
		t.Fatalf("messages: %d %s", code, b)
	}
	code, b := env.do(t, "POST", "/v1/chat/completions", `{"messages":`+chat+`,"max_tokens":1}`)
	var r chatResponse
	mustJSON(t, b, &r)
	if got := r.Usage.PromptTokensDetails.CachedTokens; code != 200 || got != (len(want)-1)/16*16 {
		t.Errorf("chat after the Messages request: cached %d; want %d", got, (len(want)-1)/16*16)
	}
}
