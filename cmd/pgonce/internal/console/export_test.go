package console

import "html/template"

// Pages returns the console's pages, parsed as [New] parses them, by name.
func Pages() (map[string]*template.Template, error) {
	h := &Handler{}
	err := h.parseTemplates()
	return h.pages, err
}

// BulkMax is the most keys one bulk action takes.
const BulkMax = bulkMax

// Visible and FromVisible are the console's rule for shown text.
var (
	Visible     = visible
	FromVisible = fromVisible
)
