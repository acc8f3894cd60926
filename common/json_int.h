// A JSON number (or a number read as a double from text) into an integer type, with a range
// check. Header-only; works on any nlohmann::basic_json without including it.
// Why: a double cast to an integer type that cannot hold it is undefined behaviour, and
// nlohmann's get<int64_t>() / value<int>() do exactly that cast for a number stored as a
// double, which is every number with a fraction or an exponent and every whole number beyond
// uint64 (10999999999999999999999999999 parses as 1.1e28). Every JSON reader (config, run
// metadata, plan schedule) takes its integers through json_int; callers word the refusal.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>

namespace rwd {

namespace detail {

// a < b across signedness without the usual arithmetic conversions (C++20's std::cmp_less).
template <class A, class B>
constexpr bool int_less(A a, B b) {
  if constexpr (std::is_signed_v<A> == std::is_signed_v<B>) return a < b;
  else if constexpr (std::is_signed_v<A>) return a < 0 || static_cast<std::make_unsigned_t<A>>(a) < b;
  else return b >= 0 && a < static_cast<std::make_unsigned_t<B>>(b);
}

template <class T, class V>
constexpr std::optional<T> int_in(V v, T lo, T hi) {
  if (int_less(v, lo) || int_less(hi, v)) return std::nullopt;
  return static_cast<T>(v);
}

}  // namespace detail

// `v` as a T in [lo, hi] when it is a whole number there; nullopt for NaN, infinities,
// fractions and numbers outside the range (the cast is only made once it is defined).
template <class T>
std::optional<T> whole_number(double v, T lo = std::numeric_limits<T>::lowest(),
                              T hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>, "an integer type");
  if (!std::isfinite(v) || v != std::floor(v)) return std::nullopt;
  // 2^digits is exact in a double and every whole double below it (and at or above T's
  // minimum, 0 or -2^digits, also exact) converts to T without overflow.
  const double top = std::ldexp(1.0, std::numeric_limits<T>::digits);
  if (v >= top || v < static_cast<double>(std::numeric_limits<T>::lowest())) return std::nullopt;
  return detail::int_in(static_cast<T>(v), lo, hi);
}

// A JSON number as a T in [lo, hi]: integers (nlohmann's signed and unsigned kinds) compared
// exactly, doubles through whole_number (so 1e3 is 1000 and 1.5 or 1.1e28 is refused).
// nullopt for a number outside that and for anything that is not a number (strings, bools).
template <class T, class Json>
std::optional<T> json_int(const Json& j, T lo = std::numeric_limits<T>::lowest(),
                          T hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>, "an integer type");
  if (j.is_number_unsigned()) return detail::int_in(j.template get<uint64_t>(), lo, hi);
  if (j.is_number_integer()) return detail::int_in(j.template get<int64_t>(), lo, hi);
  if (j.is_number_float()) return whole_number<T>(j.template get<double>(), lo, hi);
  return std::nullopt;
}

}  // namespace rwd
