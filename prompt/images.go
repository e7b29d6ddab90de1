package prompt

import "bytes"

// chatImages lists the image parts of a chat messages array, in order,
// as vLLM's chat parser finds them (chat_utils.py
// _parse_chat_message_content_mm_part). Most chats have none, and one
// search of the bytes says so without walking them.
func chatImages(messages []byte) []Image {
	if !bytes.Contains(messages, []byte("image")) {
		return nil
	}
	var imgs []Image
	i := 0
	elems(messages, func(m []byte) error {
		at := i
		i++
		if kind(m) != '{' {
			return nil
		}
		return members(m, func(k, content []byte) error {
			if kind(content) != '[' || string(key(k)) != "content" {
				return nil
			}
			return elems(content, func(part []byte) error {
				if im, ok := chatImage(part); ok {
					im.Message = at
					imgs = append(imgs, im)
				}
				return nil
			})
		})
	})
	return imgs
}

// chatImage reports whether a chat content part is an image, with its
// uuid. A part is an image by its type (image_url, input_image, and the
// image_embeds and image_pil vLLM takes from Python callers), or, with no
// type or with a uuid, by holding an image_url (a {"url"} object or a
// bare string), image_embeds or image_pil member.
func chatImage(part []byte) (Image, bool) {
	if kind(part) != '{' {
		return Image{}, false
	}
	var typ, uuid []byte
	held := false
	members(part, func(k, v []byte) error {
		switch string(key(k)) {
		case "type":
			typ = v
		case "uuid":
			uuid = v
		case "image_url", "image_embeds", "image_pil":
			held = true
		}
		return nil
	})
	if kind(uuid) == 'n' {
		uuid = nil
	}
	if kind(typ) == 0 || kind(typ) == 'n' || uuid != nil {
		return Image{UUID: uuidOf(uuid)}, held
	}
	switch t, _ := jsonString(typ, "", nil); t {
	case "image_url", "input_image", "image_embeds", "image_pil":
		return Image{}, true
	}
	return Image{}, false
}

// uuidOf is a uuid member's string ("" when not a string).
func uuidOf(v []byte) string {
	if !isStr(v) {
		return ""
	}
	s, _ := jsonString(v, "", nil)
	return s
}
