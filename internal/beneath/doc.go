// Package beneath owns descriptor-relative file work beneath a directory
// that an untrusted party can write (a session directory the guest shares):
// the one confined open (OpenAt: openat2 beneath a held descriptor, no
// symlink or magic link at any component, which the guest agent's mount
// points and the helper's home skeleton use too), opening a directory
// beneath another, listing its entries, removing a tree
// (or every entry older than a time: PruneOlder), summing its size, opening
// a regular file, reading a size-capped one, creating and removing a file, all
// relative to open directory descriptors and never following a symlink at
// any component. A party that swaps an entry for a symlink while a call
// runs makes that call fail or act on the symlink itself, never on what it
// points to.
//
// Only the directory given to Open is reached by path; the caller trusts
// that path (nobody hostile can write to its parents). Walks are bounded in
// depth (MaxDepth) and in the entries one call looks at, and read a
// directory a batch of names at a time, so a very deep or very wide tree
// costs neither the stack nor unbounded memory; a walk holds one descriptor
// per level. It needs openat2 (Linux 5.6).
package beneath
