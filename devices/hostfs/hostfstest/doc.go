// Package hostfstest is what the export layer's tests and those of the
// file servers over it (devices/p9, devices/virtiofs) share: a host
// directory laid out from a map, to export.
package hostfstest
